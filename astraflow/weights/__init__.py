"""Weights: sparse bf16 delta codec, weight stores, publisher and syncer (docs/weights.md).

>>> pub = Publisher(bus, run="demo", policy="solver", store=FileStore("/data/weights"))
>>> pub.publish(model.state_dict(), version=step)       # trainer: blocks only for a copy
>>> syncer = Syncer(bus, run="demo", policy="solver", store=HttpStore("http://trainer:8470"),
...                 target=DictTarget(engine_state), cache_dir="/tmp/af-weights")
>>> syncer.sync_once()                                   # rollout worker: between steps

The format is specified in docs/weights.md.
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
