"""Config section ``producer``: where tasks come from and how they are released.

Only pydantic here (imported by ``astraflow.config``, which ``astraflow --help`` loads).
"""

from __future__ import annotations

from typing import Literal

import pydantic

from astraflow.core.config import Section


class FieldMap(Section):
    """Which fields of a dataset row hold what (JSONL objects, Parquet columns)."""

    id: str = pydantic.Field("id", description="task id (absent: '<dataset>:<row index>')")
    prompt: str = pydantic.Field("prompt", description="a prompt string (one user message)")
    messages: str = pydantic.Field(
        "messages", description="a list of {role, content} (used when present)")
    reference: str = pydantic.Field(
        "reference", description="a mapping passed to the reward as is (used when present)")
    reference_fields: list[str] = pydantic.Field(
        ["answer", "tests"], description="otherwise: these fields are copied into the reference")


class ArithmeticConfig(Section):
    """Synthetic ``a<op>b=`` problems with a held-out split chosen by a hash of the problem, so
    the train and test splits never overlap whatever the seed or count."""

    ops: list[Literal["+", "-", "*"]] = pydantic.Field(["+"], min_length=1)
    min_value: int = pydantic.Field(0, ge=0)
    max_value: int = pydantic.Field(99, ge=0)
    split: Literal["train", "test"] = "train"
    test_fraction: float = pydantic.Field(0.05, ge=0.0, le=1.0,
                                          description="share of problems held out")
    count: int | None = pydantic.Field(
        None, ge=1, description="tasks to produce (None: the whole split once)")
    seed: int = pydantic.Field(0, description="order of the problems")

    @pydantic.model_validator(mode="after")
    def _range(self) -> ArithmeticConfig:
        if self.max_value < self.min_value:
            raise ValueError(f"max_value ({self.max_value}) < min_value ({self.min_value})")
        return self


class ProducerConfig(Section):
    """Task producers: datasets (JSONL, Parquet) and synthetic arithmetic."""

    source: Literal["arithmetic", "jsonl", "parquet"] = pydantic.Field(
        "arithmetic", description="arithmetic (synthetic), jsonl or parquet (set `path`)")
    path: list[str] = pydantic.Field(
        default_factory=list, description="dataset file(s); {out} is the run directory")
    dataset: str | None = pydantic.Field(
        None, description="dataset name in Task records (default: file stem, or 'arith')")
    fields: FieldMap = FieldMap()
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    system_prompt: str | None = pydantic.Field(
        None, description="a system message put before every prompt")
    n_samples: int = pydantic.Field(8, ge=1, description="trajectories per task (group size)")
    workflow: str = pydantic.Field("single_turn", description="Task.workflow of every task")
    topic: Literal["tasks.raw", "tasks"] = pydantic.Field(
        "tasks.raw", description="tasks.raw (through the gate) or tasks (straight to rollout)")
    epochs: int = pydantic.Field(
        1, ge=1, description="passes over the source; pass k releases attempt k (a new group)")
    max_tasks: int | None = pydantic.Field(None, ge=1, description="stop after this many")
    rate_limit: float | None = pydantic.Field(None, gt=0, description="tasks per second")
    skip_existing: bool = pydantic.Field(
        True, description="skip groups already on the topic, so a re-run produces nothing twice")
    flush_every: int = pydantic.Field(500, ge=1, description="tasks per flush")
