"""`astraflow bench replay`: the simulation on workloads with hand-computed answers, the loader
on a run directory written through the embedded bus, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.core.bus import connect
from astraflow.core.records import (
    Trajectory,
    TurnSpan,
    encode,
    pack_f32,
    pack_i32,
    pack_u8,
    schema_header,
)
from astraflow.core.topics import route, run_topics
from astraflow.sim import (
    Episode,
    Group,
    ReplayError,
    Segment,
    SimConfig,
    Workload,
    compare,
    simulate,
    synthetic,
    tail_share,
)
from astraflow.sim.recorded import load_run

runner = CliRunner()

# a = 1/8 s per decoding step whatever the batch: 8 tokens take exactly 1 s
FLAT = SimConfig(step_a=0.125, step_b=0.0, concurrency=0, train_s=1.0, batch_groups=2)


def ep(*segments: tuple[int, float]) -> Episode:
    return Episode(tuple(Segment(t, w) for t, w in segments))


def test_equal_episodes_no_tools_sync_and_async_exact() -> None:
    # 4 steps of 2 groups x 2 episodes, each 1 s of decoding (R); training 1 s (T).
    # sync: 4 x (R + T) = 8 s. async k=1: 2 steps' groups start at 0 and are done at 1; then
    # the trainer never waits (T = R): one step's groups launch as each step ends, so
    # wall = R + 4 T = 5 s.
    w = Workload([Group(f"g{i}", (ep((8, 0)), ep((8, 0)))) for i in range(8)])
    c = compare(w, FLAT)
    assert c.sync.wall_s == pytest.approx(8.0)
    assert c.async_.wall_s == pytest.approx(5.0)
    assert c.speedup == pytest.approx(1.6)
    assert c.sync.trainer_wait_ratio == pytest.approx(0.5)
    assert c.async_.trainer_wait_ratio == pytest.approx(0.2)
    assert c.sync.samples == c.async_.samples == 16
    assert c.sync.samples_per_s == pytest.approx(2.0)
    assert c.async_.staleness_max == 1 and c.sync.staleness_max == 0
    # 16 equal episodes: the slowest ceil(1.6) = 2 of them hold 2/16 of the time
    assert c.sync.tail_share == pytest.approx(2 / 16)


def test_one_slow_episode_per_step_sync_waits_on_it_async_does_not() -> None:
    # each step: one group with a 1 s episode and a 1 + 3 s one (a 3 s tool wait), one group
    # of two 1 s episodes. sync: every step waits 4 s, trains 1 s: 4 x 5 = 20 s.
    # async with k=4 launches everything at 0: the 4 fast groups are ready at 1 and fill steps
    # 1-2 (1..3 s), the slow ones are ready at 4 and fill steps 3-4 (4..6 s): 6 s.
    groups = []
    for s in range(4):
        groups += [Group(f"slow{s}", (ep((8, 3.0)), ep((8, 0)))),
                   Group(f"fast{s}", (ep((8, 0)), ep((8, 0))))]
    w = Workload(groups)
    cfg = SimConfig(**{**FLAT.__dict__, "staleness": 4})
    c = compare(w, cfg)
    assert c.sync.wall_s == pytest.approx(20.0)
    assert c.async_.wall_s == pytest.approx(6.0)
    assert c.speedup == pytest.approx(20 / 6)
    assert c.sync.trainer_wait_ratio == pytest.approx(16 / 20)
    assert c.async_.trainer_wait_ratio == pytest.approx(2 / 6)
    # durations: 4 x 4 s and 12 x 1 s; the slowest 2 hold 8 of 28 s (the same in both)
    assert c.sync.tail_share == pytest.approx(8 / 28)
    assert c.async_.tail_share == pytest.approx(8 / 28)
    # the slow groups were launched at version 0 and trained at versions 2 and 3
    assert c.async_.staleness_max == 3


def test_decode_cost_grows_with_the_batch() -> None:
    # two episodes of 2 and 4 tokens: 2 steps at batch 2, then 2 at batch 1
    cfg = SimConfig(step_a=0.01, step_b=0.001, concurrency=0, train_s=0.0, batch_groups=1)
    r = simulate(Workload([Group("g", (ep((2, 0)), ep((4, 0))))]), cfg, staleness=0)
    assert r.wall_s == pytest.approx(2 * 0.012 + 2 * 0.011)
    assert sorted(end for _, end in r.episodes) == pytest.approx([0.024, 0.046])
    assert r.engine_busy_ratio == pytest.approx(1.0)


def test_an_episode_back_from_a_tool_joins_at_the_next_step_boundary() -> None:
    # 1 s steps. A decodes 1 token, waits 0.5 s (off the engine), decodes 1 more: it is back
    # at 1.5, joins the step starting at 2 and ends at 3 while B decodes its 10 tokens to 10.
    cfg = SimConfig(step_a=1.0, step_b=0.0, concurrency=0, train_s=0.0, batch_groups=1)
    r = simulate(Workload([Group("g", (ep((1, 0.5), (1, 0)), ep((10, 0))))]), cfg,
                 staleness=0)
    assert sorted(end for _, end in r.episodes) == pytest.approx([3.0, 10.0])
    assert r.engine_busy_s == pytest.approx(10.0)


def test_concurrency_queues_episodes_and_their_time_starts_at_admission() -> None:
    cfg = SimConfig(step_a=1.0, step_b=0.0, concurrency=1, train_s=0.0, batch_groups=1)
    r = simulate(Workload([Group("g", (ep((3, 0)), ep((3, 0))))]), cfg, staleness=0)
    assert r.wall_s == pytest.approx(6.0)
    assert sorted(r.episodes) == [(0.0, 3.0), (3.0, 6.0)]


def test_tail_share_definition() -> None:
    assert tail_share([1.0] * 10) == pytest.approx(0.1)
    assert tail_share([9.0] + [1.0] * 9) == pytest.approx(0.5)
    assert tail_share([5.0, 1.0, 1.0]) == pytest.approx(5 / 7)  # ceil(0.3) = 1 episode
    assert tail_share([]) == 0.0


def test_synthetic_workload_is_seeded_and_tails_slow_sync_more() -> None:
    w = synthetic("lognormal:p50=0.05,p99=2,groups=32,group=4")
    assert w.episodes == synthetic("lognormal:p50=0.05,p99=2,groups=32,group=4").episodes
    assert len(w.groups) == 32 and all(len(g.episodes) == 4 for g in w.groups)
    cfg = SimConfig(batch_groups=4, train_s=0.5)
    heavy = compare(w, cfg)
    light = compare(synthetic("lognormal:p50=0.05,p99=0.05,groups=32,group=4"), cfg)
    # equal episodes: the slowest 10% hold about 10%; a p99/p50 of 40 in the waits, more
    assert light.sync.tail_share == pytest.approx(0.1, abs=0.02)
    assert heavy.sync.tail_share > 0.12
    assert heavy.speedup > 1.0 and light.speedup > 1.0


@pytest.mark.parametrize("spec, needle", [
    ("gamma:p50=1", "unknown synthetic workload 'gamma'"),
    ("lognormal:p50=1,p99=0.5", "p99=0.5 is below p50=1"),
    ("lognormal:mean=1", "'mean=1'"),
])
def test_bad_synthetic_specs_say_what_is_wrong(spec: str, needle: str) -> None:
    with pytest.raises(ReplayError, match=needle.replace("(", r"\(")):
        synthetic(spec)


def test_too_few_groups_for_one_step() -> None:
    with pytest.raises(ReplayError, match="fewer than one trainer step of 8"):
        simulate(Workload([Group("g", (ep((1, 0)),))], source="tiny"), SimConfig())


# -- the loader ---------------------------------------------------------------------------

def traj(group: str, index: int, policy: str, turns: list[int], timings: dict[str, float],
         created: float) -> Trajectory:
    """A trajectory of a 3-token prompt then, per turn, that many generated tokens and a
    2-token tool reply."""
    mask, spans, pos = [0, 0, 0], [TurnSpan(start=0, end=3, role="prompt")], 3
    for n in turns:
        spans.append(TurnSpan(start=pos, end=pos + n, role="assistant"))
        spans.append(TurnSpan(start=pos + n, end=pos + n + 2, role="tool"))
        mask += [1] * n + [0, 0]
        pos += n + 2
    return Trajectory(id=f"{group}/{policy}/{index}", task_id=group, group_id=group,
                      policy=policy, sample_index=index, group_size=2,
                      token_ids=pack_i32(range(pos)), loss_mask=pack_u8(mask),
                      logprobs=pack_f32([0.0] * pos), versions=pack_i32([0] * pos),
                      prompt_len=3, spans=spans, timings=timings, created_at=created)


def write_run(run_dir: Path, records: list[Trajectory], run: str = "r1") -> None:
    bus = connect(f"embedded://{run_dir}/bus.db")
    bus.create_topics(run_topics(run, ["solver", "verifier"]))
    p = bus.producer()
    for rec in records:
        topic, key = route(run, rec)
        p.produce(topic, encode(rec), key=key, headers=[schema_header(rec)])
    p.flush()
    bus.close()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    times = {"generate": 0.6, "tools": 0.4, "reward": 0.1, "verifier_latency": 0.2,
             "total": 1.5}
    records = []
    for g, created in (("b", 2.0), ("a", 1.0)):  # group a was created first
        for i in range(2):
            records.append(traj(g, i, "solver", [4, 2], times, created + i))
            records.append(traj(g, i, "verifier", [6], times, created + i))
    write_run(tmp_path, records)
    (tmp_path / "trainer-solver.jsonl").write_text(
        '{"event": "start"}\n' + "".join(
            json.dumps({"step": s, "step_s": v, "groups": 2}) + "\n"
            for s, v in enumerate((0.5, 0.7, 0.9))))
    return tmp_path


def test_loader_reads_turns_waits_groups_and_the_trainer_log(run_dir: Path) -> None:
    w = load_run(run_dir)
    assert [g.id for g in w.groups] == ["a", "b"]
    e = w.groups[0].episodes[0]
    assert e.samples == 2  # the solver's and the verifier's trajectory
    # turns in record order (solver 4, 2; verifier 6); tools (0.4 s) spread over the 2 gaps,
    # reward + verifier latency (0.3 s) after the last turn
    assert [s.tokens for s in e.segments] == [4, 2, 6]
    assert [s.wait for s in e.segments] == pytest.approx([0.2, 0.2, 0.3])
    assert w.train_s == pytest.approx(0.7) and w.batch_groups == 2
    assert w.sec_per_token == pytest.approx(0.6 / 12)
    solver_only = load_run(run_dir, policy="solver")
    assert [s.tokens for s in solver_only.groups[0].episodes[0].segments] == [4, 2]


def test_loader_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match=f"{tmp_path / 'nope'}: no such run directory"):
        load_run(tmp_path / "nope")
    with pytest.raises(ReplayError, match=f"{tmp_path} has no bus.db"):
        load_run(tmp_path)
    write_run(tmp_path, [])
    with pytest.raises(ReplayError, match=r"bus.db holds no trajectories on af.r1.trajectories"):
        load_run(tmp_path)


def test_loader_asks_for_a_run_when_there_are_several(run_dir: Path) -> None:
    write_run(run_dir, [traj("c", 0, "solver", [1], {}, 0.0)], run="r2")
    with pytest.raises(ReplayError, match=r"several runs \(r1, r2\); choose one with --run"):
        load_run(run_dir)
    assert [g.id for g in load_run(run_dir, run="r2").groups] == ["c"]
    with pytest.raises(ReplayError, match="no trajectories of run 'r3'; runs there: r1, r2"):
        load_run(run_dir, run="r3")


# -- the CLI ------------------------------------------------------------------------------

def test_cli_replays_a_run_dir_as_json_and_as_a_table(run_dir: Path) -> None:
    r = runner.invoke(app, ["bench", "replay", str(run_dir), "--json", "--step-a", "0.01"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["workload"]["groups"] == 2 and out["workload"]["samples"] == 8
    assert out["settings"]["batch_groups"] == 2 and out["settings"]["train_s"] == 0.7
    assert out["sync"]["steps"] == out["async"]["steps"] == 1
    for key in ("trainer_wait_ratio", "samples_per_s", "tail_share"):
        assert key in out["sync"] and key in out["async"]
    assert out["speedup"] == pytest.approx(
        out["async"]["samples_per_s"] / out["sync"]["samples_per_s"])

    r = runner.invoke(app, ["bench", "replay", str(run_dir)])
    assert r.exit_code == 0, r.output
    assert "trainer wait ratio" in r.output and "async/sync speedup" in r.output


def test_cli_synthetic(tmp_path: Path) -> None:
    r = runner.invoke(app, ["bench", "replay", "--synthetic",
                            "lognormal:p50=0.05,p99=2,groups=16,group=2", "--batch-groups", "4",
                            "--staleness", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["async"]["staleness"] == 2 and out["sync"]["steps"] == 4


@pytest.mark.parametrize("args, needle", [
    ([], "give a run directory or --synthetic"),
    (["{tmp}"], "has no bus.db"),
    (["{tmp}/missing"], "no such run directory"),
    (["--synthetic", "lognormal:p50=1", "--staleness", "0"], "--staleness 0: must be >= 1"),
])
def test_cli_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    r = runner.invoke(app, ["bench", "replay", *[a.format(tmp=tmp_path) for a in args]])
    assert r.exit_code == 1
    assert needle in " ".join(r.output.split())
