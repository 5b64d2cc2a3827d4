from __future__ import annotations

import pytest

from astraflow.core.errors import ConfigError
from astraflow.core.topics import TOPICS, run_topics, topic_name


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
