"""The experiment config: one YAML file describes an experiment (docs/config.md).

Each subpackage owns the model of its section; this package only composes them
(:mod:`~astraflow.config.experiment`), adds the sections of no role
(:mod:`~astraflow.config.sections`) and the checks across sections
(:mod:`~astraflow.config.checks`). Load with :func:`load_experiment` (unknown keys rejected,
every problem reported at once, ``--set`` overrides applied). Configuration only: opening
what a config points at (its bus, its models) is :mod:`astraflow.run.resources`.

Modules:

- :mod:`.checks`: The experiment config's cross-section checks: what no one section can check
  alone.
- :mod:`.experiment`: The experiment: one model composing every section (docs/config.md), and
  :func:`load_experiment`.
- :mod:`.metrics`: The ``metrics`` section: where `astraflow run` sends its metrics besides
  ``metrics.jsonl`` and Prometheus.
- :mod:`.sections`: The sections of the experiment config that belong to no role: where the bus is
  (``bus``) and how `astraflow run` lays the roles out on this host.
"""

from astraflow.config.experiment import ExperimentConfig, load_experiment
from astraflow.config.sections import BusConfig, LaunchConfig, PolicyWarmupConfig, WarmupConfig

__all__ = ["BusConfig", "ExperimentConfig", "LaunchConfig", "PolicyWarmupConfig",
           "WarmupConfig", "load_experiment"]
