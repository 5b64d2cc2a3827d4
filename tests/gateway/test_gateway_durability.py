"""Durability: every answered call is on the bus, so a new gateway over the same bus (after a
clean stop, or after ``astraflow serve`` was killed with SIGKILL) rebuilds the open sessions
and ends them with the earlier calls in their trajectories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gateway_helpers import arrays, start

from astraflow.core.bus import connect
from astraflow.core.ports import free_port

USER = [{"role": "user", "content": "Hello"}]


def test_a_new_gateway_ends_sessions_recorded_by_the_old_one(serve: Any, rule_engine: Any,
                                                              ascii_tokenizer: Any,
                                                              tmp_path: Path) -> None:
    engine = rule_engine(ascii_tokenizer, lambda p: f"n{len(p)}")
    bus = connect(f"embedded://{tmp_path}/shared.db")
    try:
        old = serve(engine, bus=bus)
        client = old.client("dur")
        r1 = client.chat.completions.create(model="default", messages=USER)
        keyed = client.chat.completions.create(
            model="default", messages=[*USER, r1.choices[0].message,
                                       {"role": "user", "content": "again"}],
            extra_headers={"Idempotency-Key": "k-2"})
        old.stop()

        new = serve(engine, bus=bus)
        assert new.gw.store.open_count == 1
        client = new.client("dur")
        # a retry of the keyed call is answered from the record, not generated again
        calls = len(engine.calls)
        retried = client.chat.completions.create(
            model="default", messages=[*USER, r1.choices[0].message,
                                       {"role": "user", "content": "again"}],
            extra_headers={"Idempotency-Key": "k-2"})
        assert retried.id == keyed.id and len(engine.calls) == calls
        client.chat.completions.create(model="default", messages=[
            *USER, r1.choices[0].message, {"role": "user", "content": "again"},
            keyed.choices[0].message, {"role": "user", "content": "last"}])
        assert new.post("/sessions/dur/end", {"reward": 2.0}).json()["done"] is True
        (t,) = new.trajectories()
        ids, mask, _, _ = arrays(t)
        assert ascii_tokenizer.decode(ids) == "<bos>Hellon5<eos>againn12<eos>lastn19<eos>"
        assert t.reward == 2.0 and new.get("/sessions/dur").json()["drift"] == 0
        # a third gateway knows the session is closed
        new.stop()
        third = serve(engine, bus=bus)
        assert third.gw.store.open_count == 0
        assert third.post("/sessions/dur/reward", {"reward": 1.0}).status_code == 409
    finally:
        bus.close()


@pytest.mark.slow
def test_sigkilled_serve_loses_no_answered_call(ascii_dir: Path, ascii_engine: Any,
                                                tmp_path: Path) -> None:
    """``astraflow serve`` (the CLI, a real process) answers two turns and is killed with
    SIGKILL; a gateway over the same bus ends the session: both turns are in the trajectory,
    with the exact tokens the killed process sampled."""
    port = free_port()
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({
        "run": "gw", "policies": ["default"],
        "bus": {"url": "embedded://{out}/bus.db", "claims": None},
        "models": {"default": {"path": str(ascii_dir)}},
        "rollout": {"engine": {"threads": 1, "max_new_tokens": 6}},
        "gateway": {"port": port}}))
    out = tmp_path / "run"  # no bus yet: `astraflow serve` starts the run's bus
    env = {**os.environ, "ASTRAFLOW_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "astraflow.cli.app", "serve", str(config),
                             "--out", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "astraflow serve did not start"
            time.sleep(0.1)
        import openai

        client = openai.OpenAI(base_url=f"{url}/sessions/killed/v1", api_key="-", max_retries=0,
                               default_headers={"X-Group-Id": "g", "X-Group-Size": "2"})
        messages: list[Any] = [{"role": "user", "content": "Hi"}]
        sampled = []
        for turn in range(2):
            r = client.chat.completions.create(
                model="default", messages=messages,
                extra_body={"return_token_ids": True, "skip_special_tokens": False})
            sampled += r.choices[0].model_extra["token_ids"]
            messages += [r.choices[0].message, {"role": "user", "content": f"t{turn}"}]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

    bus = connect(f"embedded://{out}/bus.db")
    try:
        served = start(ascii_engine, bus=bus, run="gw")
        try:
            assert served.post("/sessions/killed/end", {"reward": 1.0}).json()["done"] is True
            (t,) = served.trajectories()
        finally:
            served.stop()
    finally:
        bus.close()
    ids, mask, _, _ = arrays(t)
    assert [i for i, m in zip(ids, mask, strict=True) if m] == sampled
    assert [s.role for s in t.spans] == ["prompt", "assistant", "user", "assistant"]
