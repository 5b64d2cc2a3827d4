"""Weights: sparse bf16 delta codec, weight stores, publisher and syncer (docs/weights.md).

>>> pub = Publisher(bus, run="demo", policy="solver", store=FileStore("/data/weights"))
>>> pub.publish(model.state_dict(), version=step)       # trainer
>>> syncer = Syncer(bus, run="demo", policy="solver", store=HttpStore("http://trainer:8470"),
...                 target=DictTarget(engine_state), cache_dir="/tmp/af-weights")
>>> syncer.sync_once()                                   # rollout worker, between steps

Modules:

- :mod:`.adapter`: LoRA adapters on the rollout side.
- :mod:`.bench`: codec benchmark on a synthetic bf16 model (``astraflow weights bench``).
- :mod:`.bits`: tensors as raw bits: dtype table, digests, conversion from torch / numpy.
- :mod:`.blob`: the blob format: one self-describing file per weight version.
- :mod:`.codec`: the per-tensor codec: raw bits in, compressed bytes out, bit-exact back.
- :mod:`.config`: config section ``weights``.
- :mod:`.files`: durable local files: write to a temporary name, fsync, rename.
- :mod:`.follow`: reading ``weights.<policy>``, shared by its readers and the publisher.
- :mod:`.http`: the HTTP weight store's client, :class:`HttpStore`.
- :mod:`.mirror`: the regional mirror: each version once across the far link.
- :mod:`.netio`: socket reads with an idle timeout and a deadline.
- :mod:`.parts`: manifests of versions published from the shards.
- :mod:`.publisher`: the publisher: the trainer's side.
- :mod:`.route`: route planning: the fewest bytes to the newest version.
- :mod:`.safetensors_io`: ``.safetensors`` files as raw bits, numpy only.
- :mod:`.server`: the weight server: a read-only HTTP server over a blob directory.
- :mod:`.sharded`: publishing from the shards of a sharded trainer.
- :mod:`.store`: weight stores: where blobs live.
- :mod:`.syncer`: the syncer: keeps a rollout worker at the newest published version.
- :mod:`.target`: where a syncer puts weights: :class:`WeightTarget` and a dict target."""

from astraflow.weights.blob import (
    Blob,
    EncodedVersion,
    apply_version,
    encode_version,
    parse_blob,
)
from astraflow.weights.http import HttpStore, make_server
from astraflow.weights.mirror import Mirror, MirrorStats, serve_mirror
from astraflow.weights.publisher import Publisher, PublishStats, manifest_for
from astraflow.weights.route import Route, plan_route
from astraflow.weights.safetensors_io import read_safetensors, write_safetensors
from astraflow.weights.store import (
    BlobNotFoundError,
    FileStore,
    TokenBucket,
    UnsafePathError,
    WeightStore,
    check_path,
    download,
)
from astraflow.weights.syncer import Syncer, SyncStats
from astraflow.weights.target import DictTarget, WeightTarget

__all__ = [
    "Blob", "BlobNotFoundError", "DictTarget", "EncodedVersion", "FileStore", "HttpStore",
    "Mirror", "MirrorStats", "PublishStats", "Publisher", "Route", "SyncStats", "Syncer", "TokenBucket", "UnsafePathError",
    "WeightStore", "WeightTarget", "apply_version", "check_path", "download", "encode_version",
    "make_server", "manifest_for", "parse_blob", "plan_route", "read_safetensors",
    "serve_mirror", "write_safetensors",
]
