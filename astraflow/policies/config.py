"""Config section ``data``: the data-algorithm policies of the three stages (docs/policies.md).

A stage is a chain of policies named in order::

    data:
      pre_rollout: [gate, greso]                          # tasks.raw -> tasks
      post_rollout: [assembler, staleness, dynamic_sampling]  # trajectories -> groups.<policy>
      batch: [replay, batcher]                            # groups.<policy> -> batches.<policy>

An entry is a built-in name, ``"module.path:factory"`` (options in ``data.options``), or a
name registered under the ``astraflow.policies`` entry points (docs/plugins.md). Orders are
checked when the config is loaded. This module imports nothing heavy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
from pydantic_core import PydanticCustomError

from astraflow.core.config import Section
from astraflow.core.records.checks import RecordLimits

#: stage -> (record type it consumes, record type it must produce)
STAGES: dict[str, tuple[str, str]] = {
    "pre_rollout": ("Task", "Task"),
    "post_rollout": ("Trajectory", "TrajectoryGroup"),
    "batch": ("TrajectoryGroup", "Batch"),
}


@dataclass(frozen=True)
class Spec:
    """What the config check knows of a built-in policy."""

    consumes: str
    produces: str
    stages: tuple[str, ...]
    hint: str = ""


BUILTINS: dict[str, Spec] = {
    "gate": Spec("Task", "Task", ("pre_rollout",)),
    "greso": Spec("Task", "Task", ("pre_rollout",)),
    "assembler": Spec("Trajectory", "TrajectoryGroup", ("post_rollout",)),
    "staleness": Spec("TrajectoryGroup", "TrajectoryGroup", ("post_rollout", "batch")),
    "dynamic_sampling": Spec("TrajectoryGroup", "TrajectoryGroup", ("post_rollout",),
                             "the gate counts what post_rollout drops, so it belongs there"),
    "replay": Spec("TrajectoryGroup", "TrajectoryGroup", ("batch",)),
    "batcher": Spec("TrajectoryGroup", "Batch", ("batch",)),
}

#: which built-in produces each record type (for "put X before it" hints)
_MAKER = {"TrajectoryGroup": "assembler", "Batch": "batcher"}
_CUSTOM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


#: the entry-point group an installed package registers its policies in (astraflow plugins)
GROUP = "astraflow.policies"


def plugins() -> list[str]:
    """Names of the policies installed packages register (entry points of :data:`GROUP`)."""
    from astraflow.core.registry import entry_points

    return sorted(set(entry_points(GROUP)) - set(BUILTINS))


def is_custom(entry: str) -> bool:
    """Whether ``entry`` is a user policy: a ``module.path:factory`` or a name an installed
    package registers (its types are checked once it is built)."""
    return ":" in entry or (entry not in BUILTINS and entry in plugins())


def check_chain(stage: str, entries: list[str], specs: dict[str, Spec] | None = None,
                prefix: str | None = None) -> list[str]:
    """Every problem with the order of ``entries`` in ``stage``, as messages. ``specs`` adds
    the specs of user policies once they are imported (at build time); without them a user
    policy's types are not checked. Messages start with ``prefix`` (default
    ``data.<stage>``)."""
    known = {**BUILTINS, **(specs or {})}
    where = f"data.{stage}" if prefix is None else prefix
    top = f"{where}: " if where else ""
    problems: list[str] = []
    if len(set(entries)) != len(entries):
        dups = sorted({e for e in entries if entries.count(e) > 1})
        problems.append(f"{top}{', '.join(dups)} listed twice; a policy runs once a stage")
    flow: str | None = STAGES[stage][0]
    source = "the stage's input"
    for i, entry in enumerate(entries):
        spec = known.get(entry)
        if spec is None:
            if not is_custom(entry):
                installed = "".join(f", {n}" for n in plugins())
                problems.append(f"{where}[{i}]: unknown policy {entry!r}; valid: "
                                f"{', '.join(BUILTINS)}{installed}, or a user policy as "
                                "'module.path:factory'")
            elif ":" in entry and not _CUSTOM.match(entry):
                problems.append(f"{where}[{i}]: {entry!r} is not a 'module.path:factory' name")
            flow = None  # unknown until imported
            continue
        if stage not in spec.stages:
            hint = f" ({spec.hint})" if spec.hint else ""
            problems.append(f"{where}[{i}]: {entry} runs in {' or '.join(spec.stages)}, not "
                            f"in {stage}; move it to data.{spec.stages[0]}{hint}")
        elif flow is not None and spec.consumes != flow:
            maker = _MAKER.get(spec.consumes)
            fix = (f"; put {maker} before it" if maker and maker not in entries
                   and stage in BUILTINS[maker].stages else "")
            problems.append(f"{where}[{i}]: {entry} takes {spec.consumes} records but gets "
                            f"{flow} from {source}{fix}")
            flow, source = None, entry  # one mistake, one message: no cascade
            continue
        flow, source = spec.produces, entry
    want = STAGES[stage][1]
    if flow is not None and flow != want:
        maker = _MAKER.get(want, "a policy producing it")
        problems.append(f"{top}the stage must end with {want} records for its output "
                        f"topic but ends with {flow}; end it with {maker}")
    if "replay" in entries and "batcher" in entries:
        r, b = entries.index("replay"), entries.index("batcher")
        if b != r + 1:
            problems.append(f"{top}replay must come right before batcher (it fills each "
                            "batch's replay share, so nothing may drop groups in between)")
    return problems


class GateConfig(Section):
    """Staleness capacity gate (pre-rollout): AReaL's ``(s + version + 1) × batch`` rule."""

    max_staleness: int | None = pydantic.Field(
        None, ge=0, description="versions of staleness the released work may reach; "
                                "absent: data.max_staleness; the primary policy's entry in "
                                "data.max_staleness_per_policy wins")
    lost_after_s: float = pydantic.Field(
        3600.0, gt=0, description="a released group whose GroupStats has not come back after "
                                  "this long is written off, freeing its slot")


class GresoConfig(Section):
    """GRESO selective rollout (arXiv 2506.02177): skip tasks whose trailing run of z groups
    had zero reward variance of one kind, with probability ``1 - max(p_kind^z, floor_kind)``.
    Defaults are the authors' (see :mod:`astraflow.policies.greso` for what differs)."""

    p_easy: float = pydantic.Field(0.5, ge=0.0, le=1.0, description="initial p for 'easy'")
    p_hard: float = pydantic.Field(0.5, ge=0.0, le=1.0, description="initial p for 'hard'")
    delta_p: float = pydantic.Field(0.01, ge=0.0, le=1.0,
                                    description="step of p after each trainer step")
    alpha: float = pydantic.Field(0.25, ge=0.0, le=1.0,
                                  description="target zero-variance ratio, easy + hard")
    easy_share: float = pydantic.Field(1 / 3, ge=0.0, le=1.0,
                                       description="share of alpha for easy (hard: the rest)")
    p_min: float = pydantic.Field(0.05, ge=0.0, le=1.0, description="clamp of p from below")
    p_max: float = pydantic.Field(0.95, ge=0.0, le=1.0, description="clamp of p from above")
    floor_easy: float = pydantic.Field(0.01, ge=0.0, le=1.0,
                                       description="lowest keep probability of an easy task")
    floor_hard: float = pydantic.Field(0.01, ge=0.0, le=1.0,
                                       description="lowest keep probability of a hard task")
    warmup_steps: int = pydantic.Field(5, ge=0, description="trainer steps before p adapts")
    min_group_size: int = pydantic.Field(
        2, ge=1, description="GroupStats of fewer trajectories say nothing of variance and "
                             "are ignored")

    @pydantic.model_validator(mode="after")
    def _bounds(self) -> GresoConfig:
        if self.p_min > self.p_max:
            raise ValueError(f"p_min={self.p_min} is above p_max={self.p_max}")
        return self


class AssemblerConfig(Section):
    """Group assembly: collect the n samples' trajectories of a (policy, group id)."""

    group_size: int | None = pydantic.Field(
        None, ge=1, description="n, the samples per group, for trajectories that do not carry "
                                "it (AstraFlow's workers write Task.n_samples into each); "
                                "null: the producer's n_samples (one number, one knob)")
    min_group_size: int = pydantic.Field(
        2, ge=1, description="a group closed with fewer usable trajectories is dropped "
                             "(capped at n)")
    timeout_s: float = pydantic.Field(
        600.0, gt=0, description="a group open this long after its first trajectory is closed "
                                 "with what it has")
    failed_reasons: list[str] = pydantic.Field(
        ["error", "timeout", "aborted", "abandoned"],
        description="finish reasons of failed episodes: they count as arrived but are never "
                    "trained on (abandoned: a gateway session idle past its timeout)")


class StalenessConfig(Section):
    """Staleness filter: drop groups more than ``max_staleness`` versions old."""

    max_staleness: int | None = pydantic.Field(
        None, ge=0, description="absent: data.max_staleness; "
                                "data.max_staleness_per_policy wins for the policies it names")


class ReplayConfig(Section):
    """Replay: a share of each batch drawn from a bounded buffer of past groups."""

    ratio: float = pydantic.Field(0.25, ge=0.0, lt=1.0,
                                  description="long-run fraction of each batch replayed")
    capacity: int = pydantic.Field(256, ge=1, description="groups held in the buffer")
    selection: Literal["recent", "advantage"] = pydantic.Field(
        "recent", description="recent: newest first; advantage: sampled by mean |advantage|")
    max_staleness: int = pydantic.Field(8, ge=0,
                                        description="replayed groups at most this many "
                                                    "versions old")
    max_uses: int = pydantic.Field(1, ge=1, description="times a group may be replayed")


class RecordsConfig(Section):
    """The reward bound trajectories are checked against (docs/policies.md#errors).

    The post-rollout stage and the trainer check every trajectory's values before trusting
    them (astraflow.core.records.checks): token ids inside the policy's vocabulary, masks of
    0/1, finite rewards and logprobs; a record that fails goes to the dead-letter topic with
    its reason."""

    reward_bound: float = pydantic.Field(
        1e6, gt=0, allow_inf_nan=False,
        description="largest reward magnitude trusted; non-finite rewards are always refused")
    beyond_bound: Literal["refuse", "clip"] = pydantic.Field(
        "refuse", description="a finite reward beyond reward_bound: refuse (dead-letter the "
                              "trajectory) or clip it to the bound (in the stage and the "
                              "trainer alike)")

    def limits(self, vocab: Mapping[str, int] | None = None) -> RecordLimits:
        """These settings, with ``vocab`` (policy -> vocabulary size), as the checks take them."""
        return RecordLimits(vocab=dict(vocab or {}), reward_bound=self.reward_bound,
                            beyond_bound=self.beyond_bound)


class DataConfig(Section):
    """Data-algorithm policies: pre-rollout, post-rollout and batch stages (docs/policies.md)."""

    pre_rollout: list[str] = pydantic.Field(
        ["gate"], description="tasks.raw -> tasks: gate, greso, or module.path:factory")
    post_rollout: list[str] = pydantic.Field(
        ["assembler", "staleness"],
        description="trajectories -> groups.<policy>: assembler first, then staleness, "
                    "dynamic_sampling")
    batch: list[str] = pydantic.Field(
        ["batcher"], description="groups.<policy> -> batches.<policy>: [replay,] batcher")
    primary_policy: str | None = pydantic.Field(
        None, description="the policy whose version and groups the pre-rollout stage "
                          "follows; absent: the first of policies")
    batch_size: int = pydantic.Field(8, ge=1, description="groups per training batch (B)")
    batch_sizes: dict[str, int] = pydantic.Field(
        default_factory=dict, description="per-policy overrides of batch_size")
    max_staleness: int = pydantic.Field(4, ge=0, description="versions a group may lag the "
                                                            "trainer (gate and staleness)")
    batch_ahead: int | None = pydantic.Field(
        None, ge=1, description="back-pressure per policy: the batch stage lets batch n out "
                                "only while n - (the policy's trainer version) < batch_ahead, "
                                "so a slow or restarting trainer never meets a deep queue of "
                                "old batches (put staleness before the batcher in `batch` to "
                                "judge the waiting groups when they are read); null: no limit")
    max_staleness_per_policy: dict[str, int] = pydantic.Field(
        default_factory=dict,
        description="per-policy bounds, e.g. {verifier: 8}: a group of that policy may lag "
                    "that policy's own trainer this many versions (staleness filter; the gate "
                    "for the primary policy); wins over gate/staleness.max_staleness and "
                    "max_staleness; a policy absent here uses those")
    easy_threshold: float = pydantic.Field(
        0.5, description="a zero-variance group whose reward is >= this is 'easy', else 'hard'")
    reward_eps: float = pydantic.Field(1e-6, ge=0.0,
                                       description="rewards this close count as equal")
    gate: GateConfig = GateConfig()
    greso: GresoConfig = GresoConfig()
    assembler: AssemblerConfig = AssemblerConfig()
    staleness: StalenessConfig = StalenessConfig()
    replay: ReplayConfig = ReplayConfig()
    records: RecordsConfig = RecordsConfig()
    options: dict[str, dict[str, Any]] = pydantic.Field(
        default_factory=dict, description="keyword options for user policies, by entry")
    checkpoint_dir: str = pydantic.Field(
        "{out}/policies", description="where stage processors keep state checkpoints; {out} "
                                      "is the run directory")
    commit_interval_s: float = pydantic.Field(
        0.2, gt=0, description="longest time between checkpoint + produce + commit cycles "
                               "while input keeps arriving (an idle stage commits at once); "
                               "outputs are produced only by a cycle, so this is the "
                               "stage's added latency")
    poll_records: int = pydantic.Field(256, ge=1, description="records read per poll")
    task_routing: Literal["backlog", "key"] = pydantic.Field(
        "backlog", description="which partition of `tasks` a released task goes to: backlog "
                               "(the one whose rollout consumers have the least unfinished "
                               "work, so workers of unequal speed each get what they can do; "
                               "see astraflow.policies.routing) or key (the group id's hash: "
                               "an equal share per partition)")
    task_routing_refresh_s: float = pydantic.Field(
        1.0, gt=0, description="how often backlog routing reads the rollout group's lag")
    session_timeout_s: float = pydantic.Field(10.0, gt=0,
                                              description="consumer-group session timeout")
    dedup_window: int = pydantic.Field(
        10_000, ge=1, description="recent ids remembered to drop redelivered duplicates")

    @pydantic.field_validator("pre_rollout", "post_rollout", "batch")
    @classmethod
    def _order(cls, entries: list[str], info: pydantic.ValidationInfo) -> list[str]:
        problems = check_chain(str(info.field_name), entries, prefix="")
        if problems:
            raise PydanticCustomError("policy_order", "; ".join(problems))
        return entries

    @pydantic.field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, sizes: dict[str, int]) -> dict[str, int]:
        bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
        if bad:
            raise ValueError(f"batch sizes must be >= 1: {', '.join(bad)}")
        return sizes

    @pydantic.field_validator("max_staleness_per_policy")
    @classmethod
    def _bounds(cls, bounds: dict[str, int]) -> dict[str, int]:
        bad = [f"{k}={v}" for k, v in bounds.items() if v < 0]
        if bad:
            raise ValueError(f"staleness bounds must be >= 0: {', '.join(bad)}")
        return bounds

    def batch_size_of(self, policy: str) -> int:
        return self.batch_sizes.get(policy, self.batch_size)

    def max_staleness_of(self, policy: str, override: int | None = None) -> int:
        """The staleness bound of ``policy``: its ``max_staleness_per_policy`` entry, else
        ``override`` (a stage's own ``max_staleness``, e.g. ``staleness.max_staleness``), else
        ``max_staleness``. The policy's entry wins because it is the most specific key."""
        if policy in self.max_staleness_per_policy:
            return self.max_staleness_per_policy[policy]
        return self.max_staleness if override is None else override
