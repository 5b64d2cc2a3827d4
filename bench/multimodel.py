"""Two models trained together, pipeline vs a synchronous lockstep baseline, with and without a
long-tail verifier latency: time per iteration (one trainer step of each policy),
accuracy per step and time to a target solver accuracy, in one invocation.

    python -m bench.multimodel                                  # 4 arms, 100 s of RL each
    python -m bench.multimodel --warm runs/solver-verifier      # reuse that run's warm models
    python -m bench.multimodel --seconds 60 --only lockstep lockstep-tail
    python -m bench.multimodel --set launch.warmup.steps=0      # RL from the models as built
    python -m bench.multimodel --config examples/smollm2_team.yaml --tail-p50 0.5 --tail-p99 10

Arms (every arm starts RL from the same warm models):

* ``pipeline`` / ``pipeline-tail``: ``astraflow run <config>`` as a subprocess (producer, gate,
  rollout workers, assembler, staleness, a batcher + trainer + evaluator per policy), RL only,
  ``launch.timeout_s`` = --seconds + --startup (its processes start inside that budget).
* ``lockstep`` / ``lockstep-tail``: one process, what a colocated synchronous multi-agent
  trainer does, repeated: run the step's episodes (``data.batch_size`` tasks of the producer's
  stream, ``producer.n_samples`` each) with the real ``solver_verifier`` workflow on in-process
  ``hf`` engines (all solver turns, all verifier turns, the verifier latency of every episode
  awaited concurrently, the retries; the step waits for the last episode) → one ``rl_step`` of
  each policy (the trainer's own step, its own trainers.<policy> settings) → copy both
  policies' weights into the rollout engines (rounded to ``weights.dtype``, as the pipeline's
  workers see them). The two engines run in their own threads, so a verifier batch may
  overlap the solver's second batch: if anything this flatters the baseline.
* policies that are LoRA adapters of one base (``trainer.lora``, ``rollout.engine.adapters``:
  examples/smollm2_team.yaml): one engine of the base with an adapter view per policy, as the
  worker builds it (rows of both share forward passes); a sync puts the trainer's adapter
  (``weights.dtype``) into its policy's slot through the view's weight target, as a worker's
  syncer applies a version, and leaves the other slot alone; every accuracy is measured with
  the policy's own adapter. Such policies share one base, so RL starts from the base: no
  warm-up (a warm-up exports a merged model per policy).
* ``-tail``: ``verifier_latency`` (default lognormal p50 0.05 s, p99 2 s; --tail,
  --tail-p50/--tail-p99) after every verifier turn, seeded per episode (task id, sample
  index): both arms wait the same draws.

Measured per arm: **s/iter**, the seconds per iteration (pipeline: from the first trainer's
start to the time the slower policy reached its last common step, over that many steps;
lockstep: its clock over its steps); the solver's held-out greedy accuracy curve (pipeline:
its evaluator's lines in ``metrics.jsonl``; lockstep: every --every steps, evaluation off the
clock) and **time to --target** (default: the warm solver's accuracy + --gain 0.05); the
team's **system accuracy** curve (the workflow run greedily: answer, verdict, retry; pipeline:
its team evaluator, lockstep: with the solver's);
at the end of every arm, the bench itself measures the final models with one code path, the
evaluators' own functions: solver accuracy (greedy, alone), the verifier's judgement accuracy
(greedy verdicts on right and wrong claims about the held-out problems, balanced) and the
system accuracy (the pipeline's: its final models, LoRA adapters merged as exported). The
versions each policy reached over time (pipeline: its trainer's metric lines; lockstep: one
per iteration for every policy) show whether one policy advanced while the other lagged. The
ratios are lockstep over pipeline (> 1: the pipeline is faster).

Results: ``<out>/multimodel.json`` and a markdown table. Timing noise on 2-core machines is
large: compare within one invocation, and repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.arms import (
    ROOT,
    arm_config,
    astraflow_run,
    make_warm,
    read_yaml,
    warm_models,
    write_yaml,
)
from bench.lib.report import or_dash
from bench.lib.runlog import read_jsonl

WORKFLOW = "solver_verifier"
TAIL = {"type": "lognormal", "p50": 0.05, "p99": 2.0}
ARMS = ("pipeline", "lockstep", "pipeline-tail", "lockstep-tail")


# -- configuration ---------------------------------------------------------------------------

def check_shared_base(config: Mapping[str, Any], overrides: Sequence[str],
                      warm: Mapping[str, Path]) -> None:
    """Refuse warm models that the config's adapter policies (``rollout.engine.adapters``:
    LoRA slots of one base in one engine) cannot share: RL must start them all from one base
    (a warm-up exports a merged model per policy, which no slot can take)."""
    import copy

    from astraflow.core.config import apply_overrides

    data = apply_overrides(copy.deepcopy(dict(config)), overrides)
    adapters = data.get("rollout", {}).get("engine", {}).get("adapters") or []
    bases = {p: Path(warm[p]).resolve() for p in adapters if p in warm}
    if len(set(bases.values())) > 1:
        where = ", ".join(f"{p}: {m}" for p, m in bases.items())
        raise SystemExit(f"rollout.engine.adapters serves {', '.join(bases)} as LoRA adapters "
                         f"of one base, but RL would start them from different models "
                         f"({where}): run the bench without a warm-up "
                         "(--set launch.warmup.steps=0)")


# -- evaluation: one code path for every arm's models ---------------------------------------

def solver_accuracy(cfg: Any, model: Any, tok: Any) -> float:
    """What the solver's evaluator measures: greedy answers to the held-out problems."""
    from astraflow.consumers.evaluator import greedy_accuracy, held_out
    from astraflow.consumers.rollout.rewards import build_reward

    reward = build_reward(cfg.rollout.reward)
    model.eval()
    return greedy_accuracy(model, tok, held_out(cfg.producer, cfg.launch.eval_problems),
                           lambda t, r: float(reward(t, r)),
                           max_new_tokens=cfg.rollout.engine.max_new_tokens)


def verifier_accuracy(cfg: Any, model: Any, tok: Any) -> float:
    """What the verifier's evaluator measures: greedy verdicts on a right and a wrong claim
    about each held-out problem, accuracy averaged over the two halves (balanced)."""
    from astraflow.consumers.evaluator import greedy_verdicts, held_out_claims
    from astraflow.run.roles import verifier_turn

    prompt, max_new_tokens = verifier_turn(cfg)
    claims = held_out_claims(cfg.producer, cfg.launch.eval_problems, prompt=prompt,
                             seed=cfg.seed)
    model.eval()
    return greedy_verdicts(model, tok, claims, max_new_tokens=max_new_tokens).balanced


def system_accuracy(cfg: Any, engines: Mapping[str, Any]) -> float:
    """What the team evaluator measures: the workflow run greedily on the held-out problems
    (answer, verdict, retry; no injected latency), the fraction whose final answer is right."""
    from astraflow.consumers.evaluator import held_out
    from astraflow.consumers.team_evaluator import team_episodes

    return team_episodes(engines, held_out(cfg.producer, cfg.launch.eval_problems),
                         reward=cfg.rollout.reward.name, reward_kwargs=cfg.rollout.reward.kwargs,
                         extract=cfg.rollout.reward.extract,
                         workflow_kwargs=cfg.rollout.workflow.kwargs.get(WORKFLOW, {}),
                         max_new_tokens=cfg.rollout.engine.max_new_tokens).system_accuracy


@contextlib.contextmanager
def served(engine: Any) -> Iterator[tuple[Any, Any]]:
    """The model and tokenizer that generate as ``engine`` serves its policy, for the
    ``with`` block: an hf engine's own model; for an adapter view (``rollout.engine.adapters``:
    the policy is a LoRA slot of a shared base), the shared base with every row of its forward
    passes routed to the view's adapter at the version in its slot (the engine's own LoRA
    arithmetic; a slot that has no version yet is the base), the engine held idle meanwhile.
    What the evaluators' functions (``model.generate``) measure a policy on."""
    shared = getattr(engine, "shared", None)
    if shared is None:
        yield engine.model, engine.tokenizer
        return
    bank, policy = shared.adapters, engine.policy
    bank.slot(policy)  # a policy the engine does not serve is refused here

    def route(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rows = kwargs.get("input_ids", args[0] if args else None)
        if rows is None:
            rows = kwargs["inputs_embeds"]
        bank.route([policy] * int(rows.shape[0]))

    shared.gate.acquire()
    hook = shared.model.register_forward_pre_hook(route, with_kwargs=True)
    try:
        yield shared.model, engine.tokenizer
    finally:
        hook.remove()
        bank.route([])
        shared.gate.release()


def served_solver_accuracy(cfg: Any, engine: Any) -> float:
    """:func:`solver_accuracy` of the policy ``engine`` serves (:func:`served`)."""
    with served(engine) as (model, tok):
        return solver_accuracy(cfg, model, tok)


def served_verifier_accuracy(cfg: Any, engine: Any) -> float:
    """:func:`verifier_accuracy` of the policy ``engine`` serves (:func:`served`)."""
    with served(engine) as (model, tok):
        return verifier_accuracy(cfg, model, tok)


def evaluate(cfg: Any, engines: Mapping[str, Any]) -> dict[str, float]:
    """Solver, verifier and system accuracy of the policies ``engines`` serve (hf engines or
    adapter views of one: each policy measured with its own adapter)."""
    team = cfg.team()
    s, v = engines[team["solver"]], engines[team["verifier"]]
    return {"solver_accuracy": round(served_solver_accuracy(cfg, s), 4),
            "verifier_accuracy": round(served_verifier_accuracy(cfg, v), 4),
            "system_accuracy": round(system_accuracy(cfg, engines), 4)}


def hf_engines(cfg: Any, models: Mapping[str, Path], *,
               threads: int = os.cpu_count() or 1, adapters: bool = True) -> dict[str, Any]:
    """The rollout engines of the config (its ``rollout.engine`` settings) on ``models``, as a
    rollout worker builds them: with ``rollout.engine.adapters``, one engine of the shared
    base and an adapter view per policy. ``adapters`` False: an engine per policy whatever
    the config says (``models`` are whole models, e.g. a LoRA run's merged exports)."""
    from astraflow.consumers.rollout.service import build_engines
    from astraflow.models.config import ModelConfig

    rc = cfg.rollout
    if not adapters:
        rc = rc.model_copy(update={"engine": rc.engine.model_copy(update={"adapters": []})})
    engines = build_engines(rc, policies=cfg.policies,
                            models={p: ModelConfig(path=str(m)) for p, m in models.items()})
    import torch

    torch.set_num_threads(threads)  # building an engine sets rollout.engine.threads
    return engines


# -- the lockstep baseline -------------------------------------------------------------------

@dataclass
class Lockstep:
    """The synchronous multi-agent trainer: episodes of a step → one step of each policy →
    weights into the engines; see the module docstring. ``step()`` is one iteration."""

    cfg: Any
    models: Mapping[str, Path]
    threads: int = 2
    engines: dict[str, Any] = field(default_factory=dict)
    trainers: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    #: the trajectories of the last step by policy (what its rl_step trained on)
    trained: dict[str, list[Any]] = field(default_factory=dict)
    #: train each step on the episodes generated ``delay`` versions earlier (staleness
    #: ``delay`` without the pipeline: the same loss, its behaviour weights correcting); the
    #: first step generates ``delay + 1`` batches
    delay: int = 0

    def __post_init__(self) -> None:
        from astraflow.consumers.rollout.runtime import Runtime
        from astraflow.consumers.trainer.build import build_train_state
        from astraflow.producers.producer import tasks

        if self.delay < 0:
            raise ValueError(f"delay must be >= 0 versions, got {self.delay}")
        cfg = self.cfg
        self.engines = hf_engines(cfg, self.models, threads=self.threads)
        self.trainers = {p: build_train_state(cfg.trainer_for(p), self.models[p])
                         for p in cfg.policies}
        import torch

        torch.set_num_threads(self.threads)  # building a trainer sets trainer.threads
        self.versions = dict.fromkeys(cfg.policies, 0)
        rc = cfg.rollout
        from astraflow.consumers.rollout.context import SAMPLING_KEYS

        self.runtime = Runtime.create(
            self.engines, reward=rc.reward.name, reward_kwargs=rc.reward.kwargs,
            reward_timeout=rc.reward.timeout, tool_timeout=rc.tool_timeout,
            sampling={k: getattr(rc.engine, k) for k in SAMPLING_KEYS},
            default_workflow=rc.workflow.default, workflow_kwargs=rc.workflow.kwargs)
        self.tasks: Iterator[Any] = tasks(cfg.producer)
        self.batch = {p: cfg.data.batch_size_of(p) for p in cfg.policies}
        self._loop = asyncio.new_event_loop()
        self._pending: deque[list[tuple[tuple[Any, int], Any]]] = deque()

    def close(self) -> None:
        self._loop.run_until_complete(self.runtime.close())
        self._loop.close()

    def step(self) -> dict[str, float]:
        """One iteration; its timings (s) and training rewards."""
        from astraflow.consumers.trainer.rl import rl_step
        from astraflow.core.records import Batch, Group

        t0 = time.perf_counter()
        n_tasks = max(self.batch.values())
        while len(self._pending) <= self.delay:
            todo = [next(self.tasks) for _ in range(n_tasks)]
            self._pending.append(self._loop.run_until_complete(self._episodes(todo)))
        outs = self._pending.popleft()
        t1 = time.perf_counter()
        groups: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for (task, index), out in outs:
            for traj in self._trajectories(task, index, out):
                groups[traj.policy][traj.group_id].append(traj)
        row: dict[str, float] = {}
        for p, trainer in self.trainers.items():
            keep = [Group(group_id=g, task_id=ts[0].task_id, trajectories=ts)
                    for g, ts in groups[p].items() if len(ts) >= 2][:self.batch[p]]
            self.trained[p] = [t for g in keep for t in g.trajectories]
            m = rl_step(trainer, Batch(id=f"{p}-{self.steps}", policy=p, seq=self.steps,
                                       groups=keep), self.versions[p])
            self.versions[p] += 1
            row[f"{p}_reward"] = round(float(m.get("reward_mean", 0.0)), 4)
            for k in ("behav_weight_max", "staleness_mean", "groups_zero_adv", "grad_norm"):
                if k in m:
                    row[f"{p}_{k}"] = round(float(m[k]), 4)
        t2 = time.perf_counter()
        for p in self.trainers:
            self.sync(p)
        t3 = time.perf_counter()
        self.steps += 1
        first = self.cfg.team().get("solver", self.cfg.policies[0])
        solver = [d for _, o in outs for d in o.drafts if d.policy == first]
        # the injected waits of each episode (a verifier's, a tool's)
        waits = [sum(v for k, v in o.ctx.timings.items() if k.endswith("latency"))
                 for _, o in outs]
        row.update(step=self.steps, rollout_s=round(t1 - t0, 3), train_s=round(t2 - t1, 3),
                   sync_s=round(t3 - t2, 3), step_s=round(t3 - t0, 3),
                   latency_max_s=round(max(waits, default=0.0), 3),
                   solver_first=round(sum(d.rewards.get("first_answer", d.reward)
                                          for d in solver) / max(1, len(solver)), 4),
                   failed=sum(o.error is not None for _, o in outs))
        return row

    async def _episodes(self, todo: Sequence[Any]) -> list[tuple[tuple[Any, int], Any]]:
        from astraflow.consumers.rollout.runtime import run_episode

        keys = [(t, i) for t in todo for i in range(t.n_samples)]
        outs = await asyncio.gather(*(run_episode(self.runtime, t, i) for t, i in keys))
        return list(zip(keys, outs, strict=True))

    def _trajectories(self, task: Any, index: int, out: Any) -> list[Any]:
        """The worker's trajectory records of one episode (failed ones left out, as the
        assembler leaves them out)."""
        from astraflow.core.records import Trajectory, pack_f32, pack_i32, pack_u8

        group = task.resolved_group_id()
        vector = {p: e.version for p, e in self.engines.items()}
        roles = "agent" in Trajectory.__struct_fields__  # the role, where records carry it
        return [Trajectory(
            id=f"{group}/{d.policy}/{index}", task_id=task.id, group_id=group, policy=d.policy,
            sample_index=index, group_size=task.n_samples, token_ids=pack_i32(d.token_ids),
            loss_mask=pack_u8(d.loss_mask), logprobs=pack_f32(d.logprobs),
            versions=pack_i32(d.versions), prompt_len=d.prompt_len, spans=d.spans,
            reward=d.reward, rewards=d.rewards, turn_rewards=d.turn_rewards,
            finish_reason=d.finish_reason, worker_id="lockstep", version_vector=vector,
            **({"agent": getattr(d, "agent", "")} if roles else {}))
            for d in out.drafts if d.error is None and d.finish_reason not in ("error", "timeout")]

    def sync(self, policy: str) -> None:
        """The trainer's weights into the policy's rollout engine, in the serving dtype, and
        its version committed there. A LoRA trainer's (trainer.lora) are its adapter:
        :meth:`sync_adapter`."""
        import torch

        if self.trainers[policy].adapter is not None:
            self.sync_adapter(policy)
            return
        src = dict(self.trainers[policy].model.state_dict())
        engine = self.engines[policy]
        dtype = getattr(torch, self.cfg.weights.dtype) if self.cfg.weights.dtype else None
        version = self.versions[policy]

        def copy() -> None:
            target = engine.weight_target()
            with torch.no_grad():
                for name, t in target.tensors.items():
                    w = src[name].detach()
                    t.data.copy_((w.to(dtype) if dtype is not None else w).to(t.dtype))
            target.finish_version(version)

        engine.update_weights(copy)

    def sync_adapter(self, policy: str) -> None:
        """The LoRA trainer's adapter as the trainer publishes it (its adapter tensors, peft's
        names, cast to ``weights.dtype``) and its spec, through the policy's engine's weight
        target as a worker's syncer applies a version: every tensor applied, the spec set, the
        version committed, at a step boundary of the engine. An adapter view puts it in the
        policy's slot (the other adapters untouched); a whole-model hf engine merges it.
        Refused when the engine did not take every tensor at this version."""
        from astraflow.weights.bits import bits_dict

        trainer = self.trainers[policy]
        bits = bits_dict(trainer.state_tensors(), dtype=self.cfg.weights.dtype or None)
        if not bits:
            raise RuntimeError(f"the LoRA trainer of policy {policy!r} has no adapter tensors")
        engine = self.engines[policy]
        version = self.versions[policy]

        def apply() -> None:
            target = engine.weight_target()
            for name, (dtype, array) in bits.items():
                target.apply(name, dtype, tuple(array.shape), array.reshape(-1))
            target.set_adapter(trainer.adapter)
            target.finish_version(version)

        engine.update_weights(apply)
        check_adapter_applied(engine, policy, set(bits), version)

    def accuracy(self) -> dict[str, float]:
        """The solver's held-out accuracy and the team's system accuracy (off the clock)."""
        s = self.engines[self.cfg.team()["solver"]]
        return {"accuracy": round(served_solver_accuracy(self.cfg, s), 4),
                "system_accuracy": round(system_accuracy(self.cfg, self.engines), 4)}

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.cfg, self.engines)


def check_adapter_applied(engine: Any, policy: str, names: set[str], version: int) -> None:
    """Refuse an adapter sync that left any of ``names`` (the adapter's tensors) unwritten:
    the engine's weight target must hold every one, have handed the adapter of ``version`` to
    the engine, and the engine serve ``version``; an adapter view's slot must hold a matrix
    pair for every module the tensors name."""
    from astraflow.weights.adapter import module_pairs

    target = engine.weight_target()
    missing = sorted(names - set(target.adapter_tensors))
    if missing:
        raise RuntimeError(f"policy {policy!r}: the engine's weight target took "
                           f"{len(names) - len(missing)} of {len(names)} adapter tensors; "
                           f"missing {missing[:3]}")
    if target.adapter_version != version or engine.version != version:
        raise RuntimeError(f"policy {policy!r}: adapter version {version} not applied (the "
                           f"target holds {target.adapter_version}, the engine serves "
                           f"{engine.version})")
    shared = getattr(engine, "shared", None)
    if shared is not None:
        modules = set(module_pairs(names))
        held = set(shared.adapters.slot(policy).mats)
        if held != modules:
            raise RuntimeError(f"policy {policy!r}: its adapter slot holds {len(held)} modules, "
                               f"the adapter names {len(modules)}")


def run_lockstep(cfg: Any, models: Mapping[str, Path], *, seconds: float,
                 max_steps: int | None = None, every: int = 10, target: float | None = None,
                 threads: int = 2, final_eval: bool = True,
                 log: Callable[[str], None] = print,
                 loop_class: type[Lockstep] | None = None, delay: int = 0) -> dict[str, Any]:
    """The baseline for ``seconds`` of its clock (evaluation off the clock) or ``max_steps``
    iterations. Returns its per-step rows, solver accuracy curve and final measures.
    ``loop_class``: a :class:`Lockstep` measuring other accuracies (bench/agentic.py's);
    ``delay``: :attr:`Lockstep.delay`."""
    loop = (loop_class or Lockstep)(cfg, models, threads=threads, delay=delay)
    try:
        curve = [{"step": 0, "time": 0.0, **loop.accuracy()}]
        rows: list[dict[str, float]] = []
        clock = 0.0
        while clock < seconds and (max_steps is None or loop.steps < max_steps):
            row = loop.step()
            clock += row["step_s"]
            row["time"] = round(clock, 3)
            rows.append(row)
            if loop.steps % every == 0:
                curve.append({"step": loop.steps, "time": round(clock, 3), **loop.accuracy()})
                log(f"step {loop.steps} {clock:.1f}s solver {curve[-1]['accuracy']:.3f} "
                    f"system {curve[-1]['system_accuracy']:.3f} (last step "
                    f"{row['step_s']:.2f}s: rollout {row['rollout_s']:.2f} train "
                    f"{row['train_s']:.2f} latency max {row['latency_max_s']:.2f})")
        if curve[-1]["step"] != loop.steps:
            curve.append({"step": loop.steps, "time": round(clock, 3), **loop.accuracy()})
        steps = loop.steps
        result: dict[str, Any] = {
            "steps": {p: steps for p in cfg.policies}, "iterations": steps,
            "s_per_iter": round(clock / steps, 3) if steps else None,
            "versions": dict(loop.versions), "rows": rows,
            # lockstep: every policy moves one version per iteration, together
            "version_curve": {p: [{"time": 0.0, "version": 0}] + [
                {"time": r["time"], "version": int(r["step"])} for r in rows]
                for p in cfg.policies},
            "breakdown_s": {k: round(sum(r[k] for r in rows) / max(1, len(rows)), 3)
                            for k in ("rollout_s", "train_s", "sync_s", "latency_max_s")},
            "solver_curve": [{k: c[k] for k in ("step", "time", "accuracy")} for c in curve],
            "system_curve": [{"step": c["step"], "time": c["time"],
                              "accuracy": c["system_accuracy"]} for c in curve],
            "time_to_target_s": next((c["time"] for c in curve if target is not None
                                      and c["accuracy"] >= target), None)}
        if final_eval:
            result["final"] = {"step": steps, **loop.evaluate()}
        return result
    finally:
        loop.close()


# -- the pipeline ----------------------------------------------------------------------------

def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def pipeline_result(out: Path, policies: Sequence[str], solver: str,
                    target: float | None) -> dict[str, Any]:
    """Iteration time and curves of a finished run directory (trainer-<policy>.jsonl: exact
    step times; metrics.jsonl: the evaluators' lines)."""
    logs = {p: read_jsonl(out / f"trainer-{p}.jsonl") for p in policies}
    starts = [r["time"] for rows in logs.values() for r in rows if r.get("event") == "start"]
    steps = {p: [r for r in rows if "step" in r and "event" not in r]
             for p, rows in logs.items()}
    if not starts or not all(steps.values()):
        return {"error": f"a trainer took no step; see {out / 'logs'}",
                "steps": {p: len(s) for p, s in steps.items()}}
    t0 = min(starts)
    common = min(s[-1]["step"] for s in steps.values())
    reached = max(next(r["time"] for r in s if r["step"] >= common) for s in steps.values())
    steady = max((s[-1]["time"] - s[0]["time"]) / max(1, s[-1]["step"] - s[0]["step"])
                 for s in steps.values())
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if "eval_accuracy" in r]

    def curve(policy: str) -> list[dict[str, float]]:
        rows = [r for r in evals if r.get("policy") == policy
                or str(r.get("source", "")).startswith(f"evaluator-{policy}-")]
        return [{"step": int(r["step"]), "time": round(r["time"] - t0, 3),
                 "accuracy": r["eval_accuracy"]} for r in rows]

    solver_curve = curve(solver)
    hit = next((c for c in solver_curve if target is not None and c["accuracy"] >= target),
               None)
    to_target = None
    if hit is not None:  # when the trainer made that version, not when it was evaluated
        made = [r["time"] for r in steps[solver] if r["step"] >= hit["step"]]
        to_target = 0.0 if hit["step"] == 0 else round(min(made, default=t0) - t0, 3)
    metrics = read_jsonl(out / "metrics.jsonl")
    system = [{"step": int(r["step"]), "time": round(r["time"] - t0, 3),
               "accuracy": r["system_accuracy"]} for r in metrics if "system_accuracy" in r]
    return {"t0": t0, "steps": {p: s[-1]["step"] for p, s in steps.items()}, "iterations": common,
            "s_per_iter": round((reached - t0) / common, 3), "s_per_iter_steady": round(steady, 3),
            "rows": {p: [{k: r.get(k) for k in ("step", "time", "reward_mean", "staleness_mean",
                                                 "wait_ratio")} for r in s]
                     for p, s in steps.items()},
            "solver_curve": solver_curve,
            "verifier_curve": curve(next((p for p in policies if p != solver), "")),
            "system_curve": system, "time_to_target_s": to_target,
            "version_curve": {p: trainer_versions(metrics, p, t0) or [
                {"time": round(r["time"] - t0, 3), "version": int(r["step"])} for r in s]
                for p, s in steps.items()}}


def trainer_versions(metrics: Sequence[Mapping[str, Any]], policy: str,
                     t0: float) -> list[dict[str, float]]:
    """The versions ``policy``'s trainer had published over time, from its metric lines in a
    run's ``metrics.jsonl`` (time from ``t0``); [] when it wrote none."""
    return [{"time": round(r["time"] - t0, 3), "version": int(r["version"])} for r in metrics
            if r.get("policy") == policy and str(r.get("source", "")).startswith("trainer-")
            and "version" in r and "time" in r]


def launch_pipeline(name: str, cfg_path: Path, out: Path, *, target: float | None,
                    solver: Callable[[Any], str] | None = None) -> tuple[Any, dict[str, Any]]:
    """`astraflow run` of the arm ``cfg_path`` into ``out`` (its output in ``<name>.log``
    beside it): the loaded config and :func:`pipeline_result`, the exit code, the wall time and
    the startup added. ``solver``: the policy whose accuracy the target is of, from the config
    (the team's solver by default)."""
    from astraflow.config import load_experiment

    cfg = load_experiment(cfg_path)
    launched = time.time()
    code = astraflow_run(cfg_path, out, out.parent / f"{name}.log")
    solver_policy = solver(cfg) if solver is not None else cfg.team()["solver"]
    res = {"exit": code, "wall_s": round(time.time() - launched, 1),
           **pipeline_result(out, cfg.policies, solver_policy, target)}
    if "t0" in res:  # from the launch to the first trainer ready (not in s/iter)
        res["startup_s"] = round(res.pop("t0") - launched, 1)
    return cfg, res


def run_pipeline(name: str, cfg_path: Path, out: Path, *, target: float | None) -> dict[str, Any]:
    cfg, res = launch_pipeline(name, cfg_path, out, target=target)
    final = {p: out / "final" / p for p in cfg.policies}
    if all((f / "config.json").exists() for f in final.values()):
        engines = hf_engines(cfg, final, adapters=False)  # LoRA: the merged exports
        res["final"] = {"step": res.get("iterations"), **evaluate(cfg, engines)}
    return res


# -- the report ------------------------------------------------------------------------------

def at_step(curve: Sequence[Mapping[str, float]], step: int) -> float | None:
    """The newest accuracy measured at or before ``step``."""
    before = [c for c in curve if c["step"] <= step]
    return before[-1]["accuracy"] if before else None


def mean_upto(curve: Sequence[Mapping[str, float]], step: int) -> float | None:
    """The mean of the accuracies measured at steps 1..``step`` (per step, over the run, not
    one evaluation: the arms evaluate at different steps, each a sample of 500 problems)."""
    points = [c["accuracy"] for c in curve if 1 <= c["step"] <= step]
    return sum(points) / len(points) if points else None


def version_at(curve: Sequence[Mapping[str, float]], time_s: float) -> int:
    """The newest version of a policy's ``version_curve`` at ``time_s`` (0 before any)."""
    return max((int(c["version"]) for c in curve if c["time"] <= time_s), default=0)


def versions_line(name: str, curves: Mapping[str, Sequence[Mapping[str, float]]],
                  fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0)) -> str:
    """Where each policy's versions were at these fractions of an arm's clock (its last
    version's time): one policy may advance while the other lags."""
    end = max((c["time"] for curve in curves.values() for c in curve), default=0.0)
    marks = ", ".join(f"{q:.0%}" for q in fractions)
    per = "; ".join(f"{p} " + " / ".join(str(version_at(c, q * end)) for q in fractions)
                    for p, c in curves.items())
    return f"- {name}: versions at {marks} of {end:.0f} s: {per}"


def report(results: Mapping[str, Mapping[str, Any]], *, target: float | None) -> str:
    done = {k: r for k, r in results.items() if r.get("iterations")}
    common = min((r["iterations"] for r in done.values()), default=0)
    head = (f"| arm | s/iter | iterations | solver acc start → end | solver / system acc @ "
            f"step {common} | mean of evaluations at steps 1–{common}: solver / system | "
            f"time to solver {or_dash(target, '.2f')} (s) | final solver | final verifier | "
            "final system |")
    lines = [head, "|" + "---|" * 10]
    for name, r in results.items():
        curve = r.get("solver_curve") or []
        fin = r.get("final", {})
        lines.append(
            f"| {name} | {or_dash(r.get('s_per_iter'), '.2f')} | {r.get('iterations', '-')} | "
            f"{or_dash(curve[0]['accuracy'] if curve else None, '.3f')} → "
            f"{or_dash(curve[-1]['accuracy'] if curve else None, '.3f')} | "
            f"{or_dash(at_step(curve, common), '.3f')} / "
            f"{or_dash(at_step(r.get('system_curve') or [], common), '.3f')} | "
            f"{or_dash(mean_upto(curve, common), '.3f')} / "
            f"{or_dash(mean_upto(r.get('system_curve') or [], common), '.3f')} | "
            f"{or_dash(r.get('time_to_target_s'), '.1f')} | "
            f"{or_dash(fin.get('solver_accuracy'), '.3f')} | "
            f"{or_dash(fin.get('verifier_accuracy'), '.3f')} | "
            f"{or_dash(fin.get('system_accuracy'), '.3f')} |")
    lines.append("")
    for name, r in results.items():  # where the time goes
        if "breakdown_s" in r:
            b = r["breakdown_s"]
            lines.append(f"- {name}: per iteration {b['rollout_s']:.2f} s episodes (of which "
                         f"the slowest verifier wait {b['latency_max_s']:.2f} s), "
                         f"{b['train_s']:.2f} s training both, {b['sync_s']:.3f} s weight sync")
        elif r.get("s_per_iter_steady") is not None:
            lines.append(f"- {name}: {r['s_per_iter_steady']:.2f} s/iter after the first step "
                         f"(the slower trainer), steps {r.get('steps')}, processes started in "
                         f"{or_dash(r.get('startup_s'), '.0f')} s (not counted)")
    lines += [versions_line(name, r["version_curve"]) for name, r in results.items()
              if r.get("version_curve")]
    ratios = []
    for tail in ("", "-tail"):
        p, b = results.get(f"pipeline{tail}", {}), results.get(f"lockstep{tail}", {})
        if p.get("s_per_iter") and b.get("s_per_iter"):
            ratios.append(f"{'with' if tail else 'without'} the long tail: lockstep / pipeline "
                          f"s/iter = {b['s_per_iter'] / p['s_per_iter']:.2f}x")
        if p.get("time_to_target_s") and b.get("time_to_target_s"):
            ratios.append(f"{'with' if tail else 'without'} the long tail: lockstep / pipeline "
                          f"time to target = {b['time_to_target_s'] / p['time_to_target_s']:.2f}x")
    return "\n".join(lines + [""] + [f"- {r}" for r in ratios])


def tail_latency(tail: Mapping[str, Any] | None, p50: float | None,
                 p99: float | None) -> dict[str, Any]:
    """The verifier latency of the -tail arms: ``tail`` (--tail's JSON), or the default
    lognormal (:data:`TAIL`) with --tail-p50 / --tail-p99 in place of its percentiles."""
    if tail is not None and (p50 is not None or p99 is not None):
        raise ValueError("give --tail or --tail-p50/--tail-p99, not both")
    if tail is not None:
        return dict(tail)
    out = dict(TAIL)
    if p50 is not None:
        out["p50"] = p50
    if p99 is not None:
        out["p99"] = p99
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multimodel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "solver_verifier.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-multimodel")
    ap.add_argument("--seconds", type=float, default=100.0,
                    help="RL budget of each arm (pipeline: launch.timeout_s; lockstep: its "
                         "clock, evaluation excluded)")
    ap.add_argument("--startup", type=float, default=25.0,
                    help="pipeline: seconds added to its launch.timeout_s for starting its "
                         "processes (the lockstep clock starts after loading its models)")
    ap.add_argument("--steps", type=int, default=None, help="lockstep: at most this many")
    ap.add_argument("--every", type=int, default=10,
                    help="held-out accuracy every N steps (lockstep) or versions (the "
                         "pipeline's launch.eval_every)")
    ap.add_argument("--target", type=float, default=None,
                    help="the solver's held-out accuracy for time to target (default: the "
                         "warm solver's + --gain)")
    ap.add_argument("--gain", type=float, default=0.05,
                    help="without --target: the target is this much above the warm solver")
    ap.add_argument("--tail", type=json.loads, default=None,
                    help=f"the verifier latency of the -tail arms, JSON (default {TAIL})")
    ap.add_argument("--tail-p50", type=float, default=None,
                    help=f"the -tail arms' verifier latency: lognormal with this median (s; "
                         f"default {TAIL['p50']}); with --tail-p99, instead of --tail")
    ap.add_argument("--tail-p99", type=float, default=None,
                    help=f"... and this 99th percentile (s; default {TAIL['p99']}), e.g. "
                         "--tail-p50 0.5 --tail-p99 10 for a verifier slow enough to matter")
    ap.add_argument("--only", nargs="*", default=None, help=f"a subset of {', '.join(ARMS)}")
    ap.add_argument("--warm", type=Path, default=None,
                    help="start from the models RL started from in this finished run "
                         "directory, instead of running the warm-up")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="config override for every arm (and the warm-up), e.g. "
                         "launch.warmup.steps=0")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="lockstep: torch threads")
    args = ap.parse_args()
    arms = args.only or list(ARMS)
    unknown = set(arms) - set(ARMS)
    if unknown:
        ap.error(f"unknown arms {sorted(unknown)}; choose from {list(ARMS)}")
    from astraflow.consumers.rollout.latency import parse_latency

    try:
        args.tail = tail_latency(args.tail, args.tail_p50, args.tail_p99)
    except ValueError as e:
        ap.error(str(e))
    tail = parse_latency(args.tail, where="--tail")  # refused here, not in every episode
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    base = read_yaml(args.config)  # read once: every arm runs the same experiment
    warm_dir = args.warm or make_warm(base, args.sets, args.out)
    warm = warm_models(warm_dir)
    check_shared_base(base, args.sets, warm)
    print(f"warm models: {', '.join(f'{p}={m}' for p, m in warm.items())}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    from astraflow.config import load_experiment

    if args.target is None:
        cfg = load_experiment(write_yaml(arm_config(base, args.sets, warm, seconds=1.0,
                                                    latency=None), args.out / "target.yaml"))
        from astraflow.models.tiny import load

        start = solver_accuracy(cfg, *load(warm[cfg.team()["solver"]]))
        args.target = round(start + args.gain, 3)
        print(f"warm solver held-out accuracy {start:.3f}: target {args.target:.3f}", flush=True)

    for arm in arms:
        latency = args.tail if arm.endswith("-tail") else None
        pipeline = arm.startswith("pipeline")
        budget = args.seconds + (args.startup if pipeline else 0.0)
        data = arm_config(base, args.sets, warm, seconds=budget, latency=latency)
        # both arms evaluate on the same grid of steps: time to target is read off it
        data["launch"]["eval_every"] = args.every
        cfg_path = write_yaml(data, args.out / f"{arm}.yaml")
        print(f"[{arm}] {args.seconds:.0f} s of RL"
              f"{f', verifier latency {tail}' if latency else ''}", flush=True)
        if pipeline:
            res = run_pipeline(arm, cfg_path, args.out / arm, target=args.target)
        else:
            res = run_lockstep(load_experiment(cfg_path), warm, seconds=args.seconds,
                               max_steps=args.steps, every=args.every, target=args.target,
                               threads=args.threads,
                               log=lambda s, a=arm: print(f"[{a}] {s}", flush=True))
        results[arm] = res
        print(f"[{arm}] s/iter {res.get('s_per_iter')} iterations {res.get('iterations')} "
              f"final {res.get('final')}", flush=True)
    table = report(results, target=args.target)
    (args.out / "multimodel.json").write_text(json.dumps(
        {"command": " ".join(["python", *sys.argv]), "config": str(args.config),
         "seconds": args.seconds, "target": args.target,
         "warmup": read_json(warm_dir / "warmup.json"),
         "tail": args.tail, "warm": {p: str(m) for p, m in warm.items()},
         "sets": args.sets, "wall_s": round(time.monotonic() - started, 1),
         "results": results, "table": table}, indent=1))
    print(f"\n{args.seconds:.0f} s of RL per arm from the same warm models ({warm_dir}); "
          f"tail: {args.tail}\n")
    print(table)
    return 0 if all(r.get("exit", 0) == 0 and r.get("iterations") for r in results.values()) \
        else 1


if __name__ == "__main__":
    raise SystemExit(main())
