"""GRESO selective rollout on crafted task and stats streams."""

from __future__ import annotations

import pytest
from policy_helpers import stats, task

from astraflow.policies.base import Context
from astraflow.policies.greso import Greso, Streak


def skip_rate(g: Greso, state, tid: str, n: int) -> float:
    ctx = Context()
    kept = sum(len(g.process(task(tid, created_at=float(i)), state, ctx)) for i in range(n))
    return 1 - kept / n


def test_skip_rate_with_z3_and_p_half_converges_to_1_minus_an_eighth() -> None:
    g = Greso(p_easy=0.5, floor_easy=0.0)
    state = g.init_state()
    for i in range(3):
        g.on_stats(stats("t", "easy", group=f"t#{i}"), state, Context())
    assert state.streaks["t"].z == 3
    assert skip_rate(g, state, "t", 20_000) == pytest.approx(0.875, abs=0.01)
    assert state.counts["skipped_easy"] + state.counts["kept_easy"] == 20_000


def test_z0_is_never_skipped_and_a_variance_group_resets_the_streak() -> None:
    g = Greso(p_easy=0.0, p_hard=0.0, floor_easy=0.0, floor_hard=0.0)
    state = g.init_state()
    assert skip_rate(g, state, "fresh", 200) == 0.0
    g.on_stats(stats("t", "hard", group="t#0"), state, Context())
    assert skip_rate(g, state, "t", 200) == 1.0  # p^1 = 0, no floor
    g.on_stats(stats("t", "none", group="t#1"), state, Context())
    assert "t" not in state.streaks and skip_rate(g, state, "t", 200) == 0.0


def test_only_the_trailing_run_of_one_kind_counts() -> None:
    # GRESO's DataProfiler counts the trailing run of the current kind: after easy, easy,
    # hard the task is in a hard run of 1 (skip 1 - 0.5), not a streak of 3 (1 - 0.5^3)
    g = Greso(p_easy=0.5, p_hard=0.5, floor_easy=0.0, floor_hard=0.0)
    state = g.init_state()
    for i, kind in enumerate(["easy", "easy", "hard"]):
        g.on_stats(stats("t", kind, group=f"t#{i}"), state, Context())
    assert (state.streaks["t"].z, state.streaks["t"].kind) == (1, "hard")
    assert skip_rate(g, state, "t", 20_000) == pytest.approx(0.5, abs=0.01)
    g.on_stats(stats("t", "hard", group="t#3"), state, Context())
    g.on_stats(stats("t", "easy", group="t#4"), state, Context())
    g.on_stats(stats("t", "easy", group="t#5"), state, Context())
    assert (state.streaks["t"].z, state.streaks["t"].kind) == (2, "easy")
    assert keep_of(g, state, "t") == pytest.approx(0.25)


def keep_of(g: Greso, state, tid: str) -> float:
    return g.keep_probability(state.streaks.get(tid), state)


def test_defaults_are_the_published_ones() -> None:
    from astraflow.policies.config import GresoConfig

    for src in (Greso(), GresoConfig()):
        assert (src.p_min, src.p_max, src.delta_p) == (0.05, 0.95, 0.01)
    c = GresoConfig()
    assert (c.p_easy, c.p_hard, c.alpha, c.easy_share) == (0.5, 0.5, 0.25, 1 / 3)
    assert (c.floor_easy, c.floor_hard) == (0.01, 0.01)


def test_p_decreases_at_its_target_as_in_greso() -> None:
    g = Greso(p_easy=0.5, p_hard=0.5, alpha=0.5, easy_share=0.5, warmup_steps=0)
    state = g.init_state()
    feed_window(g, state, easy=1, hard=1, none=2, tag="w")  # both ratios exactly 0.25
    g.on_version("default", 0, 1, state, Context())
    assert state.p_easy == pytest.approx(0.49) and state.p_hard == pytest.approx(0.49)


def test_floor_bounds_the_skip_probability() -> None:
    g = Greso(p_hard=0.1, floor_hard=0.2)
    state = g.init_state()
    state.streaks["t"] = Streak(10, "hard")
    assert skip_rate(g, state, "t", 20_000) == pytest.approx(0.8, abs=0.01)


def test_same_record_same_decision() -> None:
    g = Greso(p_easy=0.5, floor_easy=0.0)
    a, b = g.init_state(), g.init_state()
    for s in (a, b):
        s.streaks["t"] = Streak(1, "easy")
    ta = [task("t", created_at=float(i)) for i in range(100)]
    da = [len(g.process(t, a, Context())) for t in ta]
    db = [len(g.process(t, b, Context())) for t in ta]
    assert da == db and 20 < sum(da) < 80


def test_stats_of_other_policies_small_groups_and_duplicates_are_ignored() -> None:
    g = Greso(primary="solver", min_group_size=2)
    state = g.init_state()
    g.on_stats(stats("t", "easy", policy="verifier"), state, Context())
    g.on_stats(stats("t", "easy", policy="solver", n=1), state, Context())
    assert state.streaks == {}
    g.on_stats(stats("t", "easy", policy="solver"), state, Context())
    g.on_stats(stats("t", "easy", policy="solver"), state, Context())  # redelivered
    assert state.streaks["t"].z == 1 and state.counts["stats_duplicate"] == 1


def feed_window(g: Greso, state, easy: int, hard: int, none: int, tag: str) -> None:
    i = 0
    for kind, n in (("easy", easy), ("hard", hard), ("none", none)):
        for _ in range(n):
            g.on_stats(stats(f"{tag}{i}", kind, group=f"{tag}{i}#0"), state, Context())
            i += 1


def test_p_adapts_by_delta_toward_targets_after_warmup_and_is_clamped() -> None:
    # targets: easy 0.25/3 = 0.083, hard 0.1667
    g = Greso(p_easy=0.5, p_hard=0.5, delta_p=0.01, alpha=0.25, easy_share=1 / 3,
              warmup_steps=2, p_min=0.45, p_max=0.52)
    state = g.init_state()
    feed_window(g, state, easy=5, hard=5, none=10, tag="w1")  # both above target
    g.on_version("default", 0, 1, state, Context())  # warm-up: no change, window reset
    g.on_version("default", 1, 2, state, Context())
    assert (state.p_easy, state.p_hard) == (0.5, 0.5) and state.window == {}
    feed_window(g, state, easy=5, hard=5, none=10, tag="w2")
    g.on_version("default", 2, 3, state, Context())
    assert state.p_easy == pytest.approx(0.49) and state.p_hard == pytest.approx(0.49)
    feed_window(g, state, easy=0, hard=1, none=99, tag="w3")  # both below target
    g.on_version("default", 3, 4, state, Context())
    assert state.p_easy == pytest.approx(0.5) and state.p_hard == pytest.approx(0.5)
    for step in range(10):  # clamped at p_max
        feed_window(g, state, easy=0, hard=0, none=10, tag=f"u{step}")
        g.on_version("default", 4 + step, 5 + step, state, Context())
    assert state.p_easy == pytest.approx(0.52) and state.p_hard == pytest.approx(0.52)
    g.on_version("other", 0, 100, state, Context())  # another policy's steps do not count
    assert state.counts["adapt_steps"] == 12
