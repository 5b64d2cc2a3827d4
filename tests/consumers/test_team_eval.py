"""Evaluation of a solver_verifier team, per policy and as a system: the verifier's judgement
(balanced over right and wrong claims), the team's greedy episode (the workflow's own code),
and the metrics.jsonl lines, summary, plots and view that name every policy."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.consumers.episodes import greedy_kwargs
from astraflow.consumers.evaluator import VersionWatch, held_out, verdict_score
from astraflow.consumers.team_evaluator import team_episodes
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.records import ChatMessage
from astraflow.producers.sources import TaskSpec
from astraflow.run.collector import Collector
from astraflow.run.resources import open_bus

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "solver_verifier.yaml"


def example(**overrides: Any) -> ExperimentConfig:
    sets = [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    return load_experiment(EXAMPLE, ["launch.eval_problems=40", *sets])


# --------------------------------------------------------------------------- pure parts

def claim(correct: bool) -> TaskSpec:
    return TaskSpec(id="c", prompt=[], reference={"correct": "1" if correct else "0"})


def test_verdict_score_balances_the_two_halves() -> None:
    claims = [claim(True)] * 4 + [claim(False)] * 2
    # right claims: 3 approved, 1 unclear; wrong claims: 1 rejected, 1 approved
    s = verdict_score([True, True, True, None, False, True], claims)
    assert (s.right, s.wrong, s.unclear, s.n) == (0.75, 0.5, 1 / 6, 6)
    assert s.balanced == 0.625
    always_yes = verdict_score([True] * 6, claims)
    assert (always_yes.right, always_yes.wrong, always_yes.balanced) == (1.0, 0.0, 0.5)


def test_version_watch_evaluates_every_n_versions_or_when_idle() -> None:
    now = [0.0]
    w = VersionWatch(["solver", "verifier"], every=3, idle_s=5.0, clock=lambda: now[0])
    assert not w.due()
    w.seen("solver", 2)
    assert not w.due()  # 2 < every, not idle yet
    w.seen("verifier", 3)
    assert w.due() and w.take() == {"solver": 2, "verifier": 3}
    assert not w.due()
    w.seen("solver", 3)
    w.seen("solver", None)  # nothing new
    now[0] += 4.9
    assert not w.due()
    now[0] += 0.2  # the newest version was left alone idle_s: the final one is evaluated
    assert w.due() and w.take() == {"solver": 3, "verifier": 3}


def test_version_watch_keeps_every_when_versions_come_slower_than_idle_s() -> None:
    # a trainer stepping every 4 s (idle_s 2): versions are not each taken as "idle", so every
    # 10th is evaluated; the last one is, once left alone three times the pace (12 s)
    now = [0.0]
    w = VersionWatch(["p"], every=10, idle_s=2.0, clock=lambda: now[0])
    evaluated = []
    for v in range(1, 26):
        for _ in range(8):  # the evaluator's ticks between two versions
            now[0] += 0.5
            if w.due():
                evaluated.append(w.take()["p"])
        w.seen("p", v)
    assert evaluated == [10, 20]
    assert w.per_version == pytest.approx(4.0) and w.idle_after == pytest.approx(12.0)
    now[0] += 11.9
    assert not w.due()
    now[0] += 0.2
    assert w.due() and w.take() == {"p": 25}
    # versions reached in one sync after a pause share its time: 3 versions 24.1 s after
    # the last is a pace of 8.03 s a version (moving mean: 0.7 · 4 + 0.3 · 8.03), not 24.1
    now[0] += 12.0
    w.seen("p", 28)
    assert w.per_version == pytest.approx(0.7 * 4.0 + 0.3 * 24.1 / 3)
    with pytest.raises(ValueError, match="every >= 1"):
        VersionWatch(["p"], every=0)


def test_greedy_kwargs_pin_temperature_for_every_role() -> None:
    kw = greedy_kwargs("solver_verifier", {"verifier_prompt": "{problem}{answer}?", "temperature": 1.0,
                                           "top_p": 0.9, "max_new_tokens": 6,
                                           "verifier_latency": {"p50": 1},
                                           "role_sampling": {"verifier": {
                                               "temperature": 0.7, "stop": ["\n"]}}})
    assert kw == {"verifier_prompt": "{problem}{answer}?", "max_new_tokens": 6,
                  "temperature": 0.0, "role_sampling": {"verifier": {"stop": ["\n"]}}}


# ------------------------------------------------------- the team's episode, scripted engines

def first_right(a: int) -> bool:
    return a % 2 == 0


def retry_right(a: int) -> bool:
    return a % 3 != 0


def verdict_of(a: int, correct: bool) -> bool | None:
    if a % 11 == 0:
        return None
    return (a % 5 != 0) if correct else (a % 7 == 0)


def solver_rule(text: str) -> str:
    problems = re.findall(r"(\d+)\+(\d+)=", text)
    a, b = map(int, problems[0])
    ok = first_right(a) if len(problems) == 1 else retry_right(a)
    return str(a + b if ok else a + b + 1)


def verifier_rule(text: str) -> str:
    m = re.fullmatch(r"(\d+)\+(\d+)=(\d+)\?", text)
    assert m, text
    a, b, c = map(int, m.groups())
    v = verdict_of(a, a + b == c)
    return "??" if v is None else "yes" if v else "no"


def expected(specs: Sequence[TaskSpec]) -> dict[str, float]:
    """The team's outcome by the rules above, without the workflow."""
    final = first = retried = unclear = 0
    for s in specs:
        a = int(s.prompt[0].content.split("+")[0])
        v = verdict_of(a, first_right(a))
        first += first_right(a)
        retried += v is False
        unclear += v is None
        final += retry_right(a) if v is False else first_right(a)
    n = len(specs)
    return {"system_accuracy": final / n, "first_accuracy": first / n,
            "retry_rate": retried / n, "unclear_rate": unclear / n, "error_rate": 0.0}


def test_team_system_accuracy_equals_the_workflow_on_scripted_episodes(rule_engine) -> None:
    from astraflow.consumers.rollout.runtime import Runtime, run_episode
    from astraflow.core.records import Task
    from astraflow.models.tiny import build_tokenizer

    cfg = example(launch__eval_problems=300)
    tok = build_tokenizer("team")
    specs = held_out(cfg.producer, 300)
    # each answers by a rule of the prompt's text: the solver ``a+b=`` (first turn) or
    # ``a+b=<answer>a+b=`` (the retry); the verifier judges ``a+b=c?``
    engines = {"solver": rule_engine(tok, solver_rule, version=7),
               "verifier": rule_engine(tok, verifier_rule, version=7)}
    kwargs = cfg.rollout.workflow.kwargs["solver_verifier"]
    res = team_episodes(engines, specs, workflow_kwargs=kwargs, max_new_tokens=4)
    want = expected(specs)
    assert 0 < want["retry_rate"] < 1 and 0 < want["unclear_rate"] < 1  # every branch taken
    assert want["system_accuracy"] != want["first_accuracy"]
    assert res.gauges() == pytest.approx(want)
    assert res.n == 300 and res.versions == {"solver": 7, "verifier": 7}
    # concurrent episodes were batched: a few engine calls per turn, not one per episode
    assert engines["solver"].batches <= 4 and engines["verifier"].batches <= 2

    async def as_rollout() -> list[float]:
        """The same engines as a rollout worker runs them (its sampling, temperature 1)."""
        rt = Runtime.create(engines, reward="exact_match", default_workflow="solver_verifier",
                            sampling={"temperature": 1.0, "max_new_tokens": 4},
                            workflow_kwargs={"solver_verifier": kwargs})
        tasks = [Task(id=s.id, dataset="t", prompt=s.prompt, reference=s.reference,
                      workflow="solver_verifier") for s in specs]
        outs = await asyncio.gather(*(run_episode(rt, t, 0) for t in tasks))
        await rt.close()
        return [next(d for d in o.drafts if d.policy == "solver").rewards["final_answer"]
                for o in outs]

    finals = asyncio.run(as_rollout())
    assert sum(f > 0.5 for f in finals) / len(finals) == res.system_accuracy


def test_a_team_that_checks_with_the_calculator_is_evaluated_as_the_workflow_runs(
        rule_engine) -> None:
    """The team evaluator runs the tool check as the rollout does: the calculator is called
    on the verifier's expression and the verdict is the claim against its answer."""
    from astraflow.models.tiny import build_tokenizer

    cfg = example(launch__eval_problems=200)
    tok = build_tokenizer("ascii")
    specs = held_out(cfg.producer, 200)

    def solver(text: str) -> str:
        if "?c" in text:  # the retry, after "?c<expression> = <value>"
            return re.findall(r"-?\d+", text)[-1]  # the calculator's value
        a, b = map(int, re.findall(r"(\d+)\+(\d+)=", text)[0])
        return str(a + b if a % 2 == 0 else a + b + 1)

    def verifier(text: str) -> str:  # writes the check: right, wrong (a*b) or none
        a, b = map(int, re.findall(r"(\d+)\+(\d+)=", text)[0])
        return "" if a % 11 == 0 else f"{a}*{b}" if a % 5 == 0 else f"{a}+{b}"

    engines = {"solver": rule_engine(tok, solver, version=3),
               "verifier": rule_engine(tok, verifier, version=4)}
    kwargs = {"verifier_prompt": "{problem}{answer}?", "verifier_tool": "calculator",
              "tool_verdict": True, "retry_prompt": "?c{check}\n",
              "rewards": {"verifier": "verdict_and_work"}}
    res = team_episodes(engines, specs, workflow_kwargs=kwargs, max_new_tokens=12)
    final = first = retried = unclear = 0
    for spec in specs:
        a, b = map(int, re.findall(r"(\d+)\+(\d+)=", spec.prompt[-1].content)[0])
        answer = a + b if a % 2 == 0 else a + b + 1
        first += answer == a + b
        if a % 11 == 0:  # no expression: no verdict, the first answer stands
            unclear += 1
            final += answer == a + b
            continue
        told = a * b if a % 5 == 0 else a + b
        if answer == told:
            final += answer == a + b
        else:  # rejected: the retry says the calculator's value
            retried += 1
            final += told == a + b
    n = len(specs)
    assert 0 < unclear < retried < n
    assert res.gauges() == pytest.approx({
        "system_accuracy": final / n, "first_accuracy": first / n, "retry_rate": retried / n,
        "unclear_rate": unclear / n, "error_rate": 0.0})


# ------------------------------------------------------------- real tiny models, on the bus

def constant_verifier(word: str, *, steps: int = 40, seed: int = 0) -> Any:
    """A tiny team model SFT'd for a few steps to answer every claim with ``word``."""
    import torch

    from astraflow.models.prompt import encode, render_prompt
    from astraflow.models.tiny import build_model, build_tokenizer

    torch.set_num_threads(1)  # tiny matrices: more threads only contend
    tok = build_tokenizer("team")
    rng = random.Random(seed)
    model = build_model(tok, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    target = [*encode(tok, word, special=False), tok.eos_token_id]
    for _ in range(steps):
        rows = []
        for _ in range(32):
            a, b = rng.randrange(100), rng.randrange(100)
            text = f"{a}+{b}={a + b + rng.choice([0, 1, -1])}?"
            rows.append(render_prompt(tok, [ChatMessage(role="user", content=text)])[1])
        width = max(len(p) for p in rows) + len(target)
        ids = torch.full((len(rows), width), tok.pad_token_id)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        labels = torch.full((len(rows), width), -100)
        for i, p in enumerate(rows):
            seq = p + target
            ids[i, width - len(seq):] = torch.tensor(seq)
            att[i, width - len(seq):] = 1
            labels[i, width - len(target):] = torch.tensor(target)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=att, position_ids=pos, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


@pytest.fixture(scope="module")
def saying_no(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from astraflow.models.tiny import save

    model, tok = constant_verifier("no")
    return save(model, tok, tmp_path_factory.mktemp("models") / "no")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_verifier_and_team_evaluators_on_real_models(tmp_path: Path, saying_no: Path) -> None:
    """A verifier that rejects every claim: judgement right 0, wrong 1, balanced 0.5; in the
    team, every episode retried. The solver (a random model) is evaluated on its answers.
    The lines name each policy and kind; summary, plots and the view show every one."""
    import shutil

    from rich.console import Console

    from astraflow.run.plots import plot_run, summary
    from astraflow.run.roles import configured_evaluator, configured_team_evaluator
    from astraflow.run.view import render

    cfg = example()
    (tmp_path / "models").mkdir()
    shutil.copytree(saying_no, tmp_path / "models" / "verifier")
    bus = open_bus(cfg, tmp_path)
    col = Collector(bus, cfg.run, jsonl=tmp_path / "metrics.jsonl", policies=cfg.policies)
    emitters = []
    try:
        results = {}
        for name in ("solver", "verifier", "team"):
            m = MetricsEmitter(bus, run=cfg.run, role="evaluator-team" if name == "team"
                               else "evaluator", component=f"evaluator-{name}")
            emitters.append(m)
            ev = (configured_team_evaluator(cfg, tmp_path, bus=bus, metrics=m) if name == "team"
                  else configured_evaluator(cfg, name, tmp_path, bus=bus, metrics=m))
            try:
                ev.run(max_evals=1, timeout=30)
            finally:
                ev.close()
            results[name] = ev.results
        (solver,), (verifier,), (team,) = results["solver"], results["verifier"], results["team"]
        assert solver.kind == "answer" and solver.n == 40
        assert verifier.kind == "verdict" and verifier.n == 80  # a right and a wrong claim each
        assert verifier.extra == {"eval_right_accuracy": 0.0, "eval_wrong_accuracy": 1.0,
                                  "eval_unclear": 0.0}
        assert verifier.accuracy == 0.5
        assert (team.retry_rate, team.unclear_rate, team.error_rate) == (1.0, 0.0, 0.0)
        assert team.versions == {"solver": 0, "verifier": 0} and team.n == 40
        assert team.first_accuracy == solver.accuracy  # greedy either way: the same answers
        for _ in range(10):
            col.poll(1.0)
            if len(col.evaluators()) == 2 and col.team_evaluator() is not None:
                break
        got = {x["policy"]: x for x in lines(tmp_path / "metrics.jsonl")}
        assert got["solver"]["kind"] == "answer" and "eval_accuracy" in got["solver"]
        assert got["verifier"]["kind"] == "verdict" and got["verifier"]["eval_accuracy"] == 0.5
        assert (got["verifier"]["eval_right_accuracy"],
                got["verifier"]["eval_wrong_accuracy"]) == (0.0, 1.0)
        assert got["team"]["kind"] == "system" and "eval_accuracy" not in got["team"]
        assert got["team"]["system_accuracy"] == team.system_accuracy
        assert got["team"]["retry_rate"] == 1.0
        assert got["team"]["versions"] == {"solver": 0, "verifier": 0}
        s = summary(tmp_path / "metrics.jsonl")
        assert s["eval_last"] == solver.accuracy  # the headline: the answering policy's
        assert s["eval"]["verifier"] == {"kind": "verdict", "first": 0.5, "last": 0.5,
                                         "best": 0.5, "n": 1, "last_step": 0, "right": 0.0,
                                         "wrong": 1.0}
        assert s["system"]["last"] == team.system_accuracy
        assert s["system"]["versions"] == {"solver": 0, "verifier": 0}
        assert len(plot_run(tmp_path / "metrics.jsonl", tmp_path / "plots")) == 4
        console = Console(record=True, width=160)
        console.print(render(col, title=cfg.run))
        text = console.export_text()
        assert "solver: " in text and "verifier: judgement 0.500 (right 0.000 wrong 1.000" in text
        assert "team: system acc" in text and "verifier v0" in text
    finally:
        for m in emitters:
            m.close()
        col.close()
        bus.close()


def test_team_evaluator_follows_each_policys_weights(tmp_path: Path, saying_no: Path) -> None:
    """A new verifier version on weights.verifier (the SFT'd "no" model) is evaluated with the
    solver's version unchanged: the versions of each policy are those the team ran."""
    from safetensors.torch import load_file

    from astraflow.run.roles import configured_publisher, configured_team_evaluator

    cfg = example()
    bus = open_bus(cfg, tmp_path)
    pub = configured_publisher(cfg, "verifier", tmp_path, bus)
    ev = configured_team_evaluator(cfg, tmp_path, bus=bus)  # both models as built: random
    try:
        pub.publish(load_file(str(saying_no / "model.safetensors")), 1)
        pub.flush(timeout=60)
        ev.run(max_evals=2, timeout=120, idle_s=0.0)
        first, second = ev.results
        assert first.versions == {"solver": 0, "verifier": 0} and first.retry_rate < 1.0
        assert second.versions == {"solver": 0, "verifier": 1}
        assert second.retry_rate > 0.9  # bf16-rounded weights of a model that always says no
        assert second.first_accuracy == first.first_accuracy  # the solver did not change
    finally:
        ev.close()
        pub.close()
        bus.close()


def test_the_evaluator_outlives_a_failed_weight_sync(tmp_path) -> None:
    """A weight download reset by a cut link is retried at the next tick, not the end of the
    evaluator: a real syncer over a store that fails its first reads, on an embedded bus."""
    import threading

    import numpy as np

    from astraflow.consumers.evaluator import VersionWatch, follow
    from astraflow.core.bus import connect
    from astraflow.core.errors import WeightStoreError
    from astraflow.core.topics import run_topics
    from astraflow.weights.http import HttpStore, make_server
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore
    from astraflow.weights.syncer import Syncer
    from astraflow.weights.target import DictTarget

    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("ev", ["default"]))
    store = FileStore(tmp_path / "store")
    fails = {"left": 2}

    class CutStore(HttpStore):
        def _cut(self) -> None:
            if fails["left"] > 0:
                fails["left"] -= 1
                raise WeightStoreError("connection reset by the link")

        def open(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            self._cut()
            return super().open(*args, **kwargs)

        def read(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            self._cut()
            return super().read(*args, **kwargs)

    pub = Publisher(bus, run="ev", policy="default", store=store, dtype=None, background=False)
    pub.publish({"w": np.ones(8, np.float32)}, 1)
    srv = make_server(store.root)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    syncer = Syncer(bus, run="ev", policy="default", store=CutStore(srv.url),
                    target=DictTarget({}))
    evaluated: list[dict[str, int]] = []
    follow(bus, dlq="af.ev.dlq", component="evaluator-test",
           watch=VersionWatch(["default"], every=1), syncers={"default": syncer},
           evaluate=evaluated.append, done=lambda: bool(evaluated), idle=lambda: None,
           timeout=30, should_stop=lambda: False)
    assert evaluated == [{"default": 1}] and fails["left"] == 0
    srv.shutdown()
    srv.server_close()
    pub.close()
    bus.close()
