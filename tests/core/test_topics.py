from __future__ import annotations

import doctest

import pytest

from astraflow.core.errors import ConfigError, SchemaError
from astraflow.core.records import Batch, ChatMessage, DeadLetter, Task
from astraflow.core.topics import (
    STAGES,
    TOPICS,
    Route,
    check_group,
    group_name,
    parse_topic,
    record_key,
    route,
    run_topics,
    topic_name,
)
from astraflow.policies.config import STAGES as POLICY_STAGES


def test_names_are_namespaced_by_run_and_policy() -> None:
    assert topic_name("r1", "tasks") == "af.r1.tasks"
    assert topic_name("r1", "batches", "solver") == "af.r1.batches.solver"


def test_bad_names_are_refused_with_the_valid_options() -> None:
    with pytest.raises(ConfigError, match="valid: tasks.raw, tasks"):
        topic_name("r", "taskz")
    with pytest.raises(ConfigError, match="per policy"):
        topic_name("r", "weights")
    with pytest.raises(ConfigError, match="not per policy"):
        topic_name("r", "tasks", "solver")
    with pytest.raises(ConfigError, match="invalid run name"):
        topic_name("a b", "tasks")


def test_run_topics_covers_every_topic_and_policy() -> None:
    t = run_topics("r", ["solver", "verifier"], {"tasks": 8})
    assert t["af.r.tasks"] == 8
    assert t["af.r.trajectories"] == TOPICS["trajectories"].partitions
    assert {"af.r.weights.solver", "af.r.weights.verifier", "af.r.dlq"} <= set(t)


# -- keys and routes ------------------------------------------------------------------------------

def _batch(policy: str = "solver") -> Batch:
    return Batch(id="b1", policy=policy, seq=0, groups=[])


def _task() -> Task:
    return Task(id="t1", dataset="d", prompt=[ChatMessage(role="user", content="1+1=")])


def test_record_key_is_the_tables_key_field() -> None:
    assert record_key("tasks.raw", _task()) == b"t1"
    assert record_key("batches", _batch()) == b"solver"
    dead = DeadLetter(origin="x[0]@1", topic="x", partition=0, offset=1, key=b"k\xff",
                      value=b"", error="e", error_type="E")
    assert record_key("dlq", dead) == b"k\xff"  # bytes keys pass through unchanged
    with pytest.raises(SchemaError, match="does not go on topic 'tasks'"):
        record_key("tasks", _batch())


def test_every_record_type_routes_to_one_topic() -> None:
    assert route("r", _task()) == ("af.r.tasks", b"t1")  # tasks.raw only when named
    assert route("r", _task(), "tasks.raw") == Route("af.r.tasks.raw", b"t1")
    assert route("r", _batch("verifier")) == ("af.r.batches.verifier", b"verifier")
    routed = {d.record for d in TOPICS.values() if d.route}
    assert routed == {d.record for d in TOPICS.values()}
    with pytest.raises(SchemaError, match="names no policy"):
        route("r", _batch(""))


def test_parse_topic_inverts_topic_name() -> None:
    for run, policies in (("r1", ["solver"]), ("a-b_c", ["x", "y-z"])):
        for name in run_topics(run, policies):
            ref = parse_topic(name)
            assert ref.run == run and topic_name(*ref) == name
    for bad in ("af.r.nope", "af.r.batches", "af.r.tasks.solver", "x.r.tasks", "af..tasks"):
        with pytest.raises(ConfigError, match="not a run's topic"):
            parse_topic(bad)


# -- consumer groups ------------------------------------------------------------------------------

def test_group_names_are_namespaced_by_run() -> None:
    assert group_name("r1", "rollout") == "af.r1.rollout"
    assert group_name("r1", "rollout") != group_name("r2", "rollout")
    assert group_name("r1", "trainer", policy="solver") == "af.r1.trainer.solver"
    assert group_name("r1", "policy", stage="pre_rollout") == "af.r1.policy.pre_rollout"
    assert (group_name("r1", "policy", stage="batch", policy="s", side=True)
            == "af.r1.policy.batch.s.side")
    every = [group_name(run, "rollout") for run in ("a", "b")] + [
        group_name(run, "policy", stage=s, policy="p" if s == "batch" else None, side=side)
        for run in ("a", "b") for s in STAGES for side in (False, True)]
    assert len(set(every)) == len(every)


def test_bad_group_requests_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="valid: rollout, scaler, trainer, policy"):
        group_name("r", "reporter")
    with pytest.raises(ConfigError, match="per policy: pass policy="):
        group_name("r", "trainer")
    with pytest.raises(ConfigError, match="per stage"):
        group_name("r", "policy")
    with pytest.raises(ConfigError, match="not per policy"):
        group_name("r", "policy", stage="post_rollout", policy="s")
    with pytest.raises(ConfigError, match="no stages"):
        group_name("r", "rollout", side=True)
    with pytest.raises(ConfigError, match="invalid run name"):
        group_name("a.b", "rollout")
    with pytest.raises(ConfigError, match="invalid consumer group name"):
        check_group("two words")
    assert check_group("legacy.rollout-1") == "legacy.rollout-1"


def test_stages_match_the_policies_package() -> None:
    assert tuple(POLICY_STAGES) == STAGES


def test_doctests() -> None:
    import astraflow.core.topics as topics

    assert doctest.testmod(topics).failed == 0
