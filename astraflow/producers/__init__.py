"""Task sources: datasets (JSONL, Parquet) and synthetic arithmetic, produced to ``tasks.raw``
(through the gate) or ``tasks`` (straight to rollout).

>>> from astraflow.producers import produce_tasks
>>> produce_tasks(bus, config.producer, run="demo")
"""

from astraflow.producers.arithmetic import split_of
from astraflow.producers.producer import (
           ProduceStats,
           existing_groups,
           produce,
           produce_tasks,
           tasks,
)
from astraflow.producers.sources import SourceError, TaskSpec, read_jsonl, read_parquet

__all__ = ["ProduceStats", "SourceError", "TaskSpec", "existing_groups", "produce",
           "produce_tasks", "read_jsonl", "read_parquet", "split_of", "tasks"]
