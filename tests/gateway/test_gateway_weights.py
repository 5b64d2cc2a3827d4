"""The gateway built from an experiment config follows ``weights.<policy>`` like a rollout
worker: a version the trainer publishes reaches its engine, and the tokens sampled after it
are recorded with that version. Also the ``gateway`` section's checks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from astraflow.config import ExperimentConfig
from astraflow.core.bus import connect
from astraflow.core.errors import ConfigError
from astraflow.core.topics import run_topics
from astraflow.gateway.app import create_app
from astraflow.gateway.server import ServerThread
from astraflow.run.roles import configured_gateway
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore


def test_tokens_carry_the_version_the_gateway_followed(ascii_dir: Path, tmp_path: Path) -> None:
    from gateway_helpers import Served, arrays

    from astraflow.consumers.rollout.engines import build_engine
    from astraflow.models.tiny import load

    config = ExperimentConfig.model_validate({
        "run": "wv", "bus": {"url": "embedded://{out}/bus.db", "claims": None},
        "rollout": {"engine": {"max_new_tokens": 4}, "weights": {"poll_interval": 0.05}},
        "gateway": {"aliases": {"gpt-4o-mini": "default"}}})
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("wv", ["default"]))
    engine = build_engine("hf", model_path=ascii_dir, threads=1)  # its own: weights change
    gw = configured_gateway(config, tmp_path, bus=bus, engines={"default": engine})
    srv = ServerThread(create_app(gw)).start()
    served = Served(srv.url, gw, bus, "wv", srv)
    try:
        client = served.client("w", default_headers={"X-Group-Id": "g", "X-Group-Size": "2"})
        messages: list[Any] = [{"role": "user", "content": "a"}]
        r = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        trainer, _ = load(ascii_dir)
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(0.01 * torch.randn_like(p))
        pub = Publisher(bus, run="wv", policy="default", store=FileStore(tmp_path / "weights"))
        pub.publish(trainer.state_dict(), 1)
        pub.flush()
        deadline = time.monotonic() + 30
        while engine.version != 1:
            assert time.monotonic() < deadline, "the gateway did not take version 1"
            time.sleep(0.02)
        assert served.get("/health").json()["versions"] == {"default": 1}
        messages += [r.choices[0].message, {"role": "user", "content": "b"}]
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert served.post("/sessions/w/end", {"reward": 1.0}).json()["done"] is True
        (t,) = served.trajectories()
        _, mask, _, versions = arrays(t)
        turns = [[v for v, m in zip(versions[s.start:s.end], mask[s.start:s.end],
                                    strict=True) if m] for s in t.spans if s.role == "assistant"]
        assert [set(v) for v in turns] == [{0}, {1}]
        assert t.version_vector == {"default": 1}
        pub.close()
    finally:
        srv.stop()
        bus.close()


def test_gateway_section_is_checked_at_load() -> None:
    from astraflow.core.config import load

    with pytest.raises(ConfigError) as e:
        load(ExperimentConfig, None, ["gateway.policies=[solver]", "gateway.aliases.x=nope"])
    assert "gateway.policies: unknown policy" in e.value.problems[0]
    assert len(e.value.problems) == 2
    assert "gateway.aliases.x" in e.value.problems[1] and "'nope'" in e.value.problems[1]
    with pytest.raises(ConfigError, match=r"gateway.tool_result_format.*\{output\}"):
        load(ExperimentConfig, None, ["gateway.tool_result_format=<r/>"])
