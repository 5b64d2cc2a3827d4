"""Config section ``producer``: where tasks come from and how they are released, and which
of them are held out for evaluation (docs/tasks.md).

Only pydantic here (imported by ``astraflow.config``, which ``astraflow --help`` loads).
"""

from __future__ import annotations

import re
from typing import Any, Literal

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
    answer_regex: str | None = pydantic.Field(
        None, description="a regex searched in the reference's 'answer'; the answer becomes its "
                          "first group (or the whole match), e.g. '####\\s*(.+)$' for GSM8K's "
                          "'... #### 42'; a row it does not match is an error")

    @pydantic.field_validator("answer_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"not a valid regular expression ({e})") from None
        return value


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


class ReasoningGymConfig(Section):
    """A reasoning-gym task suite (``source: reasoning_gym``, reward ``reasoning_gym``).

    Seeded procedural problems scored by the dataset's own ``score_answer``. Train and held-out
    items come from their own seeds, and a hash of the question text splits the questions
    themselves, so no question is in both."""

    dataset: str = pydantic.Field(
        "basic_arithmetic", description="a reasoning-gym dataset name, e.g. basic_arithmetic, "
                                        "chain_sum, syllogism, gsm_symbolic")
    config: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="the dataset's config fields, e.g. {min_terms: 2, "
                                          "max_terms: 2} (not seed or size)")
    size: int = pydantic.Field(1000, ge=1, description="train items per pass")
    test_size: int = pydantic.Field(
        200, ge=1, description="held-out items (distinct questions; fewer when the dataset has "
                               "fewer)")
    seed: int = pydantic.Field(0, ge=0, description="seed of the train items")
    test_seed: int = pydantic.Field(
        1_000_000_007, ge=0, description="seed of the held-out items (must differ from seed)")
    test_fraction: float = pydantic.Field(
        0.2, gt=0.0, lt=1.0,
        description="share of the question space (by a hash of the question) reserved for the "
                    "held-out split; the held-out split generates ~test_size/test_fraction "
                    "items, so raise it for slow generators")

    @pydantic.field_validator("config")
    @classmethod
    def _no_seed(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted({"seed", "size"} & set(value))
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set in config: use "
                             "producer.reasoning_gym.seed / test_seed / size / test_size")
        return value

    @pydantic.model_validator(mode="after")
    def _seeds(self) -> ReasoningGymConfig:
        if self.seed == self.test_seed:
            raise ValueError(f"producer.reasoning_gym.test_seed ({self.test_seed}) equals seed: "
                             "the held-out items need their own seed; set another test_seed")
        return self


class HFDatasetsConfig(Section):
    """A Hugging Face ``datasets`` source (``source: hf_datasets``), from local disk only.

    A folder written by ``save_to_disk``, or local data files; a hub is never reached."""

    path: str | None = pydantic.Field(
        None, description="a folder written by Dataset/DatasetDict.save_to_disk, or one data "
                          "file; {out} is the run directory")
    data_files: str | list[str] | dict[str, str | list[str]] | None = pydantic.Field(
        None, description="local data files instead of path: a file, a list, or split -> "
                          "file(s), e.g. {train: gsm8k/train.jsonl, test: gsm8k/test.jsonl}")
    format: Literal["json", "csv", "parquet"] | None = pydantic.Field(
        None, description="the data files' format (null: from the file extension; .jsonl is "
                          "json)")
    split: str = pydantic.Field("train", description="the split tasks are produced from")
    test_split: str | None = pydantic.Field(
        "test", description="the held-out split; when the dataset lacks it, producer."
                            "test_fraction of `split` is held out instead")
    cache_dir: str | None = pydantic.Field(
        None, description="where datasets caches data files it converts (null: its default, "
                          "~/.cache/huggingface/datasets); {out} is the run directory")


class ProducerConfig(Section):
    """Task producers: datasets, reasoning-gym task suites, synthetic arithmetic (docs/tasks.md).

    Datasets are JSONL, Parquet or Hugging Face ``datasets``; every source has a held-out split
    for evaluation, disjoint from what it trains on."""

    source: Literal["arithmetic", "jsonl", "parquet", "reasoning_gym", "hf_datasets"] = (
        pydantic.Field("arithmetic", description="arithmetic (synthetic), jsonl or parquet (set "
                                                 "`path`), reasoning_gym, hf_datasets (their "
                                                 "sections)"))
    path: list[str] = pydantic.Field(
        default_factory=list, description="dataset file(s); {out} is the run directory")
    test_path: list[str] = pydantic.Field(
        default_factory=list,
        description="jsonl/parquet: held-out file(s) for evaluation; rows whose prompt is also "
                    "in them are left out of training")
    test_fraction: float = pydantic.Field(
        0.0, ge=0.0, lt=1.0,
        description="jsonl/parquet without test_path, hf_datasets without its test_split: "
                    "share of the rows held out, chosen by a hash of the prompt (0: none, every "
                    "row trains)")
    dataset: str | None = pydantic.Field(
        None, description="dataset name in Task records (default: file stem, 'rg/<dataset>' "
                          "or 'arith')")
    fields: FieldMap = FieldMap()
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    reasoning_gym: ReasoningGymConfig = ReasoningGymConfig()
    hf_datasets: HFDatasetsConfig = HFDatasetsConfig()
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
    max_lead: int | None = pydantic.Field(
        10_000, ge=1,
        description="at most about this many tasks on the topic that its reader (the "
                    "pre-rollout stage; the rollout group for `tasks`) has not taken yet: the "
                    "producer waits for the reader (checked at each flush), so a run of many "
                    "epochs does not write them all at its start; null: no bound")
