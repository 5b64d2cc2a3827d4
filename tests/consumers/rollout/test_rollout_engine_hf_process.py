"""The hf engine in a process of its own (``rollout.engine.process``): the same tokens and
logprobs as in-process, weight updates that land between two decoding steps of the engine
process, a killed engine process that fails only its batch and comes back on the shared weights,
and no engine process left behind by a worker killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from rollout_helpers import make_task, produce, read_all
from waiting import alive, wait_for

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.engines import EngineError, GenRequest, build_engine
from astraflow.consumers.rollout.engines.hf_process import ProcessEngine
from astraflow.core.bus import Bus
from astraflow.core.records import Trajectory, unpack
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_worker
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore

TOL = 1e-4


@pytest.fixture
def engine(arith_dir: Path) -> Any:
    e = build_engine("hf", model_path=arith_dir, threads=1, seed=1, process=True)
    yield e
    e.close()


def prompts(tok: Any) -> list[list[int]]:
    return [tok(t)["input_ids"] for t in ("1+1=", "12+34=", "987*6=", "5-55=", "3=")]


def perturbed(arith_dir: Path, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """A new weight version: the model's tensors moved by ``scale`` noise."""
    from astraflow.models.tiny import load

    model, _ = load(arith_dir)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def write(engine: ProcessEngine, state: dict[str, torch.Tensor], version: int) -> None:
    """Stands in for the syncer: the tensors into the weight target, then the version."""
    target = engine.weight_target()
    with torch.no_grad():
        for name, t in target.tensors.items():
            t.data.copy_(state[name])
    target.finish_version(version)


def test_same_tokens_and_logprobs_as_the_engine_in_process(engine: ProcessEngine,
                                                          arith_dir: Path) -> None:
    assert isinstance(engine, ProcessEngine) and engine.pid != os.getpid()
    inproc = build_engine("hf", model_path=arith_dir, threads=1, seed=1)
    tok = engine.tokenizer
    for temperature, top_p in [(0.0, 1.0), (1.0, 1.0), (1.3, 0.8)]:
        reqs = [GenRequest(p, max_new_tokens=6, temperature=temperature, top_p=top_p)
                for p in prompts(tok)]
        got, want = engine.generate(reqs), inproc.generate(reqs)
        for g, w in zip(got, want, strict=True):
            assert g.token_ids == w.token_ids  # same seed, same sampling, same weights
            assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < TOL
            assert g.versions == [0] * len(g.token_ids) and g.finish_reason == w.finish_reason
    assert engine.steps > 0
    with pytest.raises(EngineError, match="empty prompt"):  # the batch fails, the process lives
        engine.generate([GenRequest([], max_new_tokens=2)])
    assert engine.generate([GenRequest(prompts(tok)[0], max_new_tokens=2)])[0].token_ids


def test_batches_sent_at_once_come_back_to_their_callers(engine: ProcessEngine,
                                                        arith_dir: Path) -> None:
    """``pipeline_depth`` 2: the batcher may hand over a second batch while one decodes; each
    caller gets its own batch's results (greedy: as the in-process engine's)."""
    from concurrent.futures import ThreadPoolExecutor

    assert engine.pipeline_depth == 2
    inproc = build_engine("hf", model_path=arith_dir, threads=1, seed=1)
    tok = engine.tokenizer
    batches = [[GenRequest(tok(f"{a}+{b}=")["input_ids"], max_new_tokens=5, temperature=0.0)
                for b in range(a, a + 16)] for a in range(8)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(engine.generate, batches))
    for batch, results in zip(batches, got, strict=True):
        want = inproc.generate(batch)
        assert [r.token_ids for r in results] == [w.token_ids for w in want]


def test_an_update_lands_between_two_steps_of_the_engine_process(
        engine: ProcessEngine, arith_dir: Path) -> None:
    """Greedy decoding of the untrained model runs to the context limit (57 steps). The update
    is asked for once the engine process has begun step 3: no step runs while it writes, the
    tokens before it carry version 0 and those after version 1, and afterwards the engine
    process decodes on exactly the new weights."""
    tok = engine.tokenizer
    reqs = [GenRequest(tok("11+22=")["input_ids"], max_new_tokens=60, temperature=0.0)] * 64
    new = perturbed(arith_dir)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(engine.generate(reqs)))
    start = engine.steps
    t.start()
    wait_for(lambda: engine.steps >= start + 3, 60, "the batch's third step", every=0.001)

    def update() -> tuple[int, int]:
        before = engine.steps
        write(engine, new, 1)
        time.sleep(0.3)  # a step would have run by now, were the engine process not held
        return before, engine.steps

    before, after = engine.update_weights(update)
    t.join(60)
    assert before == after  # no decoding step while the weights were written
    (results,) = out
    switch = {r.versions.index(1) for r in results}
    assert len(switch) == 1  # the rows of one batch switch at the same step
    (k,) = switch
    assert 3 <= k < 57
    for r in results:  # the new weights may stop early; the old ones ran to the limit
        n = len(r.token_ids)
        assert k < n <= 57 and r.versions == [0] * k + [1] * (n - k)
    assert engine.version == 1
    # the engine process now decodes on the new weights: as an in-process engine holding them
    ref = build_engine("hf", model_path=arith_dir, threads=1, seed=1)
    ref.model.load_state_dict(new)
    short = [GenRequest(p, max_new_tokens=6, temperature=0.0) for p in prompts(tok)]
    for g, w in zip(engine.generate(short), ref.generate(short), strict=True):
        assert g.token_ids == w.token_ids and g.versions == [1] * len(g.token_ids)
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < TOL


def test_a_killed_engine_process_fails_its_batch_and_starts_again(
        engine: ProcessEngine, arith_dir: Path) -> None:
    tok = engine.tokenizer
    engine.update_weights(lambda: write(engine, perturbed(arith_dir), 4))
    reqs = [GenRequest(tok("11+22=")["input_ids"], max_new_tokens=60, temperature=0.0)] * 64
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.generate(reqs)
        except EngineError as e:
            errors.append(e)

    first = engine.pid
    assert first is not None
    start = engine.steps
    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: engine.steps >= start + 2, 60, "the batch to run", every=0.001)
    os.kill(first, signal.SIGKILL)
    t.join(60)
    assert errors and "exited with code -9" in str(errors[0])
    assert not alive(first)
    (r,) = engine.generate([GenRequest(prompts(tok)[1], max_new_tokens=4, temperature=0.0)])
    assert engine.pid not in (None, first) and engine.restarts == 1
    assert r.token_ids and r.versions == [4] * len(r.token_ids)  # the shared weights' version


@pytest.mark.slow  # 9-35 s here: out of the unit part (scripts/test.sh unit)
def test_no_engine_process_outlives_a_worker_killed_with_sigkill(arith_dir: Path) -> None:
    code = ("import sys, time\n"
            "from astraflow.consumers.rollout.engines import build_engine\n"
            f"e = build_engine('hf', model_path={str(arith_dir)!r}, threads=1, process=True)\n"
            "print(e.pid, flush=True)\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        wait_for(lambda: not alive(child), 30, "the engine process to exit")
    finally:
        parent.kill()
        parent.wait()


def test_refused_where_it_cannot_work(arith_dir: Path) -> None:
    with pytest.raises(EngineError, match="continuous"):
        build_engine("hf", model_path=arith_dir, process=True, continuous=True)
    with pytest.raises(EngineError, match="CPU only"):
        build_engine("hf", model_path=arith_dir, process=True, device="cuda")
    with pytest.raises(EngineError, match="dtype"):
        build_engine("hf", model_path=arith_dir, process=True, dtype="auto")


@pytest.mark.slow  # 9-35 s here: out of the unit part (scripts/test.sh unit)
def test_a_worker_with_the_engine_in_its_own_process_follows_published_weights(
        arith_dir: Path, tmp_path: Path) -> None:
    """Through the config: ``rollout.engine.process``, the real weight syncer applying a
    published version while tasks run; every task yields its trajectories, each trajectory's
    token versions are those the engine process reported, and later tasks run on version 1."""
    run = f"pe{uuid.uuid4().hex[:8]}"
    cfg = ExperimentConfig.model_validate({
        "run": run, "bus": {"url": f"embedded://{tmp_path}/bus.db"},
        "rollout": {"engine": {"model": str(arith_dir), "threads": 1, "max_new_tokens": 4,
                               "process": True},
                    "max_concurrent_episodes": 16, "drain_timeout": 60,
                    "commit_interval": 0.05, "poll_timeout": 0.05}})
    bus: Bus = open_bus(cfg, tmp_path)
    try:
        worker = configured_worker(cfg, tmp_path, bus=bus, worker_id="w-pe")
        (eng,) = worker.runtime.engines.values()
        assert isinstance(eng, ProcessEngine)
        pub = Publisher(bus, run=run, policy="default", store=FileStore(tmp_path / "weights"))
        n = 40
        produce(bus, run, [make_task(i, n=4) for i in range(n // 2)])

        def publish_then_more() -> None:
            wait_for(lambda: worker.stats.tasks_done >= 4, 120, "the first tasks")
            pub.publish(perturbed(arith_dir), 1)
            pub.flush()
            wait_for(lambda: eng.version == 1, 120, "version 1 in the engine")
            produce(bus, run, [make_task(i, n=4) for i in range(n // 2, n)])

        t = threading.Thread(target=publish_then_more)
        t.start()
        stats = worker.run(max_tasks=n, timeout=300)
        t.join(60)
        eng.close()
        pub.close()
        assert stats.tasks_done == n and stats.episodes_failed == 0
        trajs = read_all(bus, topic_name(run, "trajectories"), Trajectory)
        assert len({x.id for x in trajs}) == 4 * n
        by_task: dict[int, set[int]] = {}
        for x in trajs:
            generated = unpack(x.loss_mask, "u1") == 1
            by_task.setdefault(int(x.id.split("#")[0].removeprefix("task-")), set()).update(
                unpack(x.versions, "<i4")[generated].tolist())
        assert all(v == {1} for i, v in by_task.items() if i >= n // 2)  # after the update
        assert any(v == {0} for v in by_task.values())
    finally:
        bus.close()
