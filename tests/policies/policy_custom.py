"""A user policy loaded by module path in the config tests: keeps groups whose mean reward
is at least ``min_mean`` (an option from ``data.options``)."""

from __future__ import annotations

import msgspec

from astraflow.core.records import Task, TrajectoryGroup
from astraflow.policies.env import BuildEnv


class State(msgspec.Struct):
    counts: dict[str, int] = {}


class MinMean:
    name = "min_mean"
    consumes = TrajectoryGroup
    produces = TrajectoryGroup

    def __init__(self, min_mean: float) -> None:
        self.min_mean = min_mean

    def init_state(self) -> State:
        return State()

    def process(self, g: TrajectoryGroup, state: State, ctx: object) -> list:
        keep = g.reward_mean >= self.min_mean
        state.counts["kept" if keep else "dropped"] = state.counts.get(
            "kept" if keep else "dropped", 0) + 1
        return [g] if keep else []


def min_mean(env: BuildEnv) -> MinMean:
    return MinMean(**env.options)


class TaskToTask:
    name = "task_to_task"
    consumes = Task
    produces = Task

    def init_state(self) -> State:
        return State()

    def process(self, t: Task, state: State, ctx: object) -> list:
        return [t]


def task_policy(env: BuildEnv) -> TaskToTask:
    return TaskToTask()
