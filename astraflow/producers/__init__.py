"""Task sources: datasets (JSONL, Parquet, Hugging Face datasets), reasoning-gym task suites
and synthetic arithmetic, produced to ``tasks.raw`` (through the gate) or ``tasks`` (straight to
rollout); each has a held-out split (:func:`held_out_specs`) disjoint from what it trains on.

>>> from astraflow.producers import produce_tasks
>>> produce_tasks(bus, config.producer, run="demo")

Modules:

- :mod:`.arithmetic`: synthetic arithmetic tasks ``a<op>b=`` (the quickstart's data).
- :mod:`.claims`: claims for a verifier: a problem with a proposed answer.
- :mod:`.config`: config section ``producer`` (docs/tasks.md).
- :mod:`.demos`: demonstrations for the SFT warm-up, as ``Batch`` records.
- :mod:`.hf_datasets`: Hugging Face ``datasets`` from local disk (``source: hf_datasets``).
- :mod:`.producer`: the task producer: a dataset or generator → Task records.
- :mod:`.reasoning_gym`: reasoning-gym task suites (``source: reasoning_gym``).
- :mod:`.sources`: dataset readers: JSONL and Parquet rows → :class:`TaskSpec`.
- :mod:`.splits`: train and held-out splits of every task source, disjoint by construction.
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
