"""The ``weights`` config section and its factories."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from astraflow.core.config import validate
from astraflow.core.errors import ConfigError
from astraflow.weights.config import WeightsConfig, build_publisher, build_store, build_syncer
from astraflow.weights.http import HttpStore
from astraflow.weights.store import FileStore
from astraflow.weights.target import DictTarget


def test_defaults_and_errors() -> None:
    cfg = WeightsConfig()
    assert (cfg.full_every, cfg.dtype, cfg.store.type, cfg.fetch) == (20, "bfloat16", "file", None)
    with pytest.raises(ConfigError) as e:
        validate(WeightsConfig, {"full_every": 0, "store": {"type": "http"}, "codec": "x"},
                 source="weights")
    text = str(e.value)
    assert "full_every" in text and "http store needs url" in text and "codec" in text


def test_factories_publish_and_sync(bus, tmp_path: Path) -> None:
    cfg = validate(WeightsConfig, {"dtype": None, "fetch": {"type": "file",
                                                             "path": "{out}/weights"}})
    assert isinstance(build_store(cfg.store, tmp_path), FileStore)
    http = validate(WeightsConfig, {"fetch": {"type": "http", "url": "http://127.0.0.1:1"}})
    assert isinstance(build_store(http.fetch, tmp_path), HttpStore)
    pub = build_publisher(bus, cfg, run="r", policy="p", out=tmp_path)
    pub.publish({"w": np.arange(100, dtype=np.float32)}, 0)
    pub.close()
    target = DictTarget({})
    syncer = build_syncer(bus, cfg, target, run="r", policy="p", worker="w1", out=tmp_path)
    assert syncer.sync_once(timeout=5) == 0
    assert target.tensors["w"].tobytes() == np.arange(100, dtype=np.float32).tobytes()
    assert (tmp_path / "weights" / "p").is_dir()
