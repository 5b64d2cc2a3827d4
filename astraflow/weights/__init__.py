"""Weights: sparse bf16 delta codec, weight stores, publisher and syncer (docs/weights.md).

>>> pub = Publisher(bus, run="demo", policy="solver", store=FileStore("/data/weights"))
>>> pub.publish(model.state_dict(), version=step)       # trainer: blocks only for a copy
>>> syncer = Syncer(bus, run="demo", policy="solver", store=HttpStore("http://trainer:8470"),
...                 target=DictTarget(engine_state), cache_dir="/tmp/af-weights")
>>> syncer.sync_once()                                   # rollout worker: between steps

The format is specified in docs/weights.md.

Modules:

- :mod:`.adapter`: LoRA adapters on the rollout side: where adapter tensors land and how engines
  apply them.
- :mod:`.bench`: Codec benchmark on a synthetic bf16 model (``astraflow weights bench``,
  ``bench/weights.py``).
- :mod:`.bits`: Tensors as raw bits: the dtype table, digests, and conversion from torch / numpy.
- :mod:`.blob`: The blob format: one file per weight version, self-describing, checked on every
  read.
- :mod:`.codec`: The per-tensor codec: raw bits in, compressed bytes out, bit-exact back (numpy +
  zstd only).
- :mod:`.config`: Config section ``weights``: serving dtype, full-snapshot interval, codec level,
  the weight store the trainer writes and the one workers read.
- :mod:`.files`: Durable local files: write to a temporary name, fsync, rename.
- :mod:`.follow`: Reading ``weights.<policy>``: what the syncer and the mirror share.
- :mod:`.http`: The HTTP weight store's client, :class:`HttpStore` (its server is in
  :mod:`astraflow.weights.server`.
- :mod:`.mirror`: The regional mirror: fetches each weight version once across the far link and
  serves a region's workers.
- :mod:`.netio`: Socket reads with an idle timeout *and* a deadline, for the weight server and its
  client.
- :mod:`.parts`: Manifests of versions published from the shards: one blob per rank, tensors in row
  slices.
- :mod:`.publisher`: The publisher: the trainer's side.
- :mod:`.route`: Route planning: from the weights a worker holds to the newest version, for the
  fewest bytes.
- :mod:`.safetensors_io`: Read and write ``.safetensors`` files as raw bits, with numpy only (no
  torch).
- :mod:`.server`: The weight server: a small read-only HTTP server over a blob directory.
- :mod:`.sharded`: Publishing from the shards: every rank of a sharded trainer encodes the rows it
  owns.
- :mod:`.store`: Weight stores: where blobs live.
- :mod:`.syncer`: The syncer: keeps a rollout worker's weights at the newest published version.
- :mod:`.target`: Where a syncer puts weights: the :class:`WeightTarget` protocol and a
  dict-of-tensors target.
"""

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
