"""The experiment config: one YAML file describes an experiment (docs/config.md).

Each subpackage owns the model of its section; this package composes them, adds the sections
of no role and the checks across sections. Load with :func:`load_experiment` (unknown keys
rejected, every problem reported at once, ``--set`` overrides applied). Opening what a config
points at is :mod:`astraflow.run.resources`.

Modules:

- :mod:`.checks`: the cross-section checks: what no one section can check alone.
- :mod:`.experiment`: the experiment: one model composing every section, :func:`load_experiment`.
- :mod:`.metrics`: the ``metrics`` section: where `astraflow run` sends metrics.
- :mod:`.sections`: the sections of no role: ``bus`` and the layout of roles on this host."""

from astraflow.config.experiment import ExperimentConfig, load_experiment
from astraflow.config.sections import BusConfig, LaunchConfig, PolicyWarmupConfig, WarmupConfig

__all__ = ["BusConfig", "ExperimentConfig", "LaunchConfig", "PolicyWarmupConfig",
           "WarmupConfig", "load_experiment"]
