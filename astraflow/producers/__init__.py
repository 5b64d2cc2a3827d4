"""Task sources: datasets (JSONL, Parquet, Hugging Face datasets), reasoning-gym task suites
and synthetic arithmetic, produced to ``tasks.raw`` (through the gate) or ``tasks`` (straight to
rollout); each has a held-out split (:func:`held_out_specs`) disjoint from what it trains on.

>>> from astraflow.producers import produce_tasks
>>> produce_tasks(bus, config.producer, run="demo")

Modules:

- :mod:`.arithmetic`: Synthetic arithmetic tasks ``a<op>b=`` with the answer as reference (the
  quickstart's data).
- :mod:`.claims`: Claims for a verifier: a problem with a proposed answer, right or wrong, half of
  each.
- :mod:`.config`: Config section ``producer``: where tasks come from and how they are released, and
  which of them are held out for evaluation (docs/tasks.md).
- :mod:`.demos`: Demonstrations for the SFT warm-up: tasks with their reference answers, as
  training batches (``Batch`` records) on ``batches.<policy>``.
- :mod:`.hf_datasets`: Hugging Face ``datasets`` as a task source (``source: hf_datasets``), from
  local disk only.
- :mod:`.producer`: The task producer: a dataset or generator → Task records on ``tasks.raw`` (or
  ``tasks``).
- :mod:`.reasoning_gym`: reasoning-gym task suites (``source: reasoning_gym``): seeded procedural
  problems, scored by the dataset's own ``score_answer``.
- :mod:`.sources`: Dataset readers: JSONL and Parquet rows → :class:`TaskSpec` (prompt messages +
  reference).
- :mod:`.splits`: Train and held-out (test) splits of every task source, disjoint by construction.
"""

from astraflow.producers.arithmetic import split_of
from astraflow.producers.producer import (
           ProduceStats,
           existing_groups,
           produce,
           produce_tasks,
           tasks,
)
from astraflow.producers.sources import (
           SourceError,
           TaskSpec,
           read_jsonl,
           read_parquet,
           with_system,
)
from astraflow.producers.splits import held_out_specs, split_specs, task_name

__all__ = ["ProduceStats", "SourceError", "TaskSpec", "existing_groups", "held_out_specs",
           "produce", "produce_tasks", "read_jsonl", "read_parquet", "split_of", "split_specs",
           "task_name", "tasks", "with_system"]
