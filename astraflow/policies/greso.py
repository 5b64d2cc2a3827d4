"""GRESO selective rollout (pre-rollout, ``tasks.raw → tasks``; arXiv 2506.02177).

Per task, from the GroupStats feedback on ``stats``: ``z``, the length of the trailing run of
zero-variance groups of one kind (easy or hard). A task is skipped with probability
``1 - max(p_kind^z, floor_kind)``; z = 0 is never skipped. After each trainer step past
``warmup_steps``, each p moves by ``delta_p`` toward its target zero-variance ratio. The draw
is counter-based, so a re-read record decides the same. The rules and how they differ from
the authors' implementation: docs/policies.md.
"""

from __future__ import annotations

import msgspec

from astraflow.core.records import GroupStats, Record, Task
from astraflow.policies.base import Context, bump, remember, uniform
from astraflow.policies.env import BuildEnv


class Streak(msgspec.Struct, array_like=True):
    z: int
    kind: str  # "easy" | "hard"
    draws: int = 0


class GresoState(msgspec.Struct, kw_only=True):
    p_easy: float = 0.5
    p_hard: float = 0.5
    streaks: dict[str, Streak] = {}
    window: dict[str, int] = {}  # "easy" / "hard" / "total" groups since the last step
    seen: dict[str, int] = {}  # recent group ids of GroupStats (redelivery)
    counts: dict[str, int] = {}


class Greso:
    name = "greso"
    levels = frozenset({"streaks", "p_easy", "p_hard"})  # current values (gauges), not counts
    consumes = Task
    produces = Task
    wants = frozenset({"stats"})

    def __init__(self, *, primary: str = "default", p_easy: float = 0.5, p_hard: float = 0.5,
                 delta_p: float = 0.01, alpha: float = 0.25, easy_share: float = 1 / 3,
                 p_min: float = 0.05, p_max: float = 0.95, floor_easy: float = 0.01,
                 floor_hard: float = 0.01, warmup_steps: int = 5, min_group_size: int = 2,
                 seed: int = 0, dedup_window: int = 10_000) -> None:
        self.primary = primary
        self.p0 = (p_easy, p_hard)
        self.delta_p = delta_p
        self.targets = {"easy": alpha * easy_share, "hard": alpha * (1 - easy_share)}
        self.p_min, self.p_max = p_min, p_max
        self.floors = {"easy": floor_easy, "hard": floor_hard}
        self.warmup_steps = warmup_steps
        self.min_group_size = min_group_size
        self.seed = seed
        self.dedup_window = dedup_window

    def init_state(self) -> GresoState:
        return GresoState(p_easy=self.p0[0], p_hard=self.p0[1])

    def keep_probability(self, streak: Streak | None, state: GresoState) -> float:
        if streak is None or streak.z == 0:
            return 1.0
        p = state.p_easy if streak.kind == "easy" else state.p_hard
        return max(p ** streak.z, self.floors[streak.kind])

    def process(self, task: Task, state: GresoState, ctx: Context) -> list[Record]:
        s = state.streaks.get(task.id)
        keep = self.keep_probability(s, state)
        if s is None or keep >= 1.0:
            bump(state.counts, "passed")
            return [task]
        u = uniform(self.seed, "greso", task.id, task.attempt, repr(task.created_at), s.draws)
        s.draws += 1
        if u < keep:
            bump(state.counts, f"kept_{s.kind}")
            bump(state.counts, "passed")
            return [task]
        bump(state.counts, f"skipped_{s.kind}")
        bump(state.counts, "skipped")
        return []

    def on_stats(self, st: GroupStats, state: GresoState, ctx: Context) -> None:
        if st.policy != self.primary:
            return
        if st.n < self.min_group_size:
            bump(state.counts, "stats_too_small")
            return
        if not remember(state.seen, f"{st.policy}/{st.group_id}", self.dedup_window):
            bump(state.counts, "stats_duplicate")
            return
        bump(state.counts, "stats")
        state.window["total"] = state.window.get("total", 0) + 1
        if st.zero_variance == "none":
            state.streaks.pop(st.task_id, None)
            return
        state.window[st.zero_variance] = state.window.get(st.zero_variance, 0) + 1
        s = state.streaks.get(st.task_id)
        if s is None:
            state.streaks[st.task_id] = Streak(1, st.zero_variance)
        elif s.kind == st.zero_variance:
            s.z += 1
        else:  # the other kind: only the trailing run counts, so a new run starts
            s.z, s.kind = 1, st.zero_variance

    def on_version(self, policy: str, old: int, new: int, state: GresoState,
                   ctx: Context) -> None:
        if policy != self.primary:
            return
        window, state.window = state.window, {}
        total = window.get("total", 0)
        if new <= self.warmup_steps or total == 0:
            return
        bump(state.counts, "adapt_steps")
        for kind in ("easy", "hard"):
            ratio = window.get(kind, 0) / total
            step = -self.delta_p if ratio >= self.targets[kind] else self.delta_p
            attr = f"p_{kind}"
            p = min(self.p_max, max(self.p_min, getattr(state, attr) + step))
            setattr(state, attr, p)

    def counters(self, state: GresoState) -> dict[str, float]:
        return {**state.counts, "streaks": len(state.streaks), "p_easy": state.p_easy,
                "p_hard": state.p_hard}


def build(env: BuildEnv) -> Greso:
    g = env.data.greso
    return Greso(primary=env.primary, p_easy=g.p_easy, p_hard=g.p_hard, delta_p=g.delta_p,
                 alpha=g.alpha, easy_share=g.easy_share, p_min=g.p_min, p_max=g.p_max,
                 floor_easy=g.floor_easy, floor_hard=g.floor_hard,
                 warmup_steps=g.warmup_steps, min_group_size=g.min_group_size, seed=env.seed,
                 dedup_window=env.data.dedup_window)
