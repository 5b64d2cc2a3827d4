"""A task's ``workflow`` field is data from the tasks topic: it may name a registered
workflow, or one the config names, and any other ``module:function`` only where the config
allows it (``rollout.workflow.allow_task_paths``) — refused before anything is imported or
called, and dead-lettered by the worker."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from rollout_helpers import ScriptedEngine, make_task, produce, read_all

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.runtime import EpisodeOutcome, Runtime, run_episode
from astraflow.core.records import DeadLetter, Task
from astraflow.core.registry import RegistryError
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_worker


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """An importable module whose import leaves a mark (a file), with an async workflow ``run``;
    returns its name and the mark's path."""
    name = f"af_planted_{uuid.uuid4().hex[:8]}"
    mark = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"open({str(mark)!r}, 'w').close()\n"
        "async def run(ctx, task):\n"
        "    gen = await ctx.generate(messages=task.prompt)\n"
        "    return gen.conversation.finish(1.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, mark
    sys.modules.pop(name, None)


@pytest.fixture
def os_system_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """``os.system`` replaced by a recorder: a task naming ``os:system`` must never reach it."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(os, "system", lambda *a, **k: calls.append(a) or 0)
    return calls


def episode(rt: Runtime, task: Task) -> EpisodeOutcome:
    async def go() -> EpisodeOutcome:
        try:
            return await run_episode(rt, task, 0)
        finally:
            await rt.close()

    return asyncio.run(go())


def test_a_task_cannot_name_a_module_path_by_default(
        ascii_tokenizer: Any, planted: tuple[str, Path], os_system_calls: list) -> None:
    name, mark = planted
    rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, ["x"])})
    for path in (f"{name}:run", "os:system"):
        with pytest.raises(RegistryError, match="rollout.workflow.allow_task_paths") as info:
            rt.workflow(path)
        assert path in str(info.value) and "single_turn" in str(info.value)  # valid names
        task = make_task(0, n=1, workflow=path)
        out = episode(rt, task)
        assert out.error is not None and "allow_task_paths" in out.error
        assert [d.finish_reason for d in out.drafts] == ["error"]
    assert name not in sys.modules and not mark.exists()  # not even imported
    assert os_system_calls == []


def test_config_named_workflows_and_allowed_paths_run(
        ascii_tokenizer: Any, planted: tuple[str, Path]) -> None:
    name, mark = planted
    path = f"{name}:run"
    for kw in ({"default_workflow": path}, {"workflow_kwargs": {path: {}}},
               {"allow_workflow_paths": True}):
        rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, ["x"])}, **kw)
        out = episode(rt, make_task(0, n=1, workflow=path))
        assert out.error is None and out.drafts[0].reward == 1.0, (kw, out.error)
    assert mark.exists()


def test_an_allowed_path_must_name_an_async_workflow_before_it_is_called(
        ascii_tokenizer: Any, os_system_calls: list) -> None:
    rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, ["x"])},
                        allow_workflow_paths=True)
    with pytest.raises(RegistryError, match="not an async function"):
        rt.workflow("os:system")
    out = episode(rt, make_task(0, n=1, workflow="os:system"))
    assert out.error is not None and "not an async function" in out.error
    assert os_system_calls == []


def test_the_worker_dead_letters_tasks_naming_module_paths(
        tmp_path: Path, arith_dir: Path, planted: tuple[str, Path],
        os_system_calls: list) -> None:
    name, mark = planted
    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}",
        "bus": {"url": f"embedded://{tmp_path}/bus.db", "partitions": {"tasks": 1}},
        "rollout": {"engine": {"model": str(arith_dir), "threads": 1, "max_new_tokens": 2},
                    "weights": {"enabled": False}, "commit_interval": 0.05,
                    "poll_timeout": 0.05, "metrics_interval": 0.2}})
    assert cfg.rollout.workflow.allow_task_paths is False  # the default
    bus = open_bus(cfg, tmp_path)
    try:
        produce(bus, cfg.run, [make_task(0, n=1), make_task(1, n=1, workflow="os:system"),
                               make_task(2, n=1, workflow=f"{name}:run")])
        stats = configured_worker(cfg, tmp_path, bus=bus, worker_id="w-1").run(max_tasks=3)
        dead = read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)
    finally:
        bus.close()
    assert stats.tasks_done == 1 and stats.tasks_dead_lettered == 2
    assert sorted(d.key for d in dead) == [b"task-1", b"task-2"]
    assert all("allow_task_paths" in d.error for d in dead)
    assert name not in sys.modules and not mark.exists() and os_system_calls == []
