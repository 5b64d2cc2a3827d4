"""AstraFlow: dataflow-oriented reinforcement learning for LLM agents.

Every component is an independent process that consumes records from durable topics and
produces records to other topics (docs/architecture.md). The public entry point of the
dataflow is :func:`astraflow.core.bus.connect`.

Modules:

- :mod:`.cli` (a package): the `astraflow` command, one module per command (docs/cli.md).
- :mod:`.config` (a package): the experiment config, one YAML file (docs/config.md).
- :mod:`.consumers` (a package): rollout workers, trainers, evaluators, the scaler.
- :mod:`.core` (a package): the dataflow spine: records, topics, the bus, errors.
- :mod:`.gateway` (a package): the agent gateway, ``astraflow serve`` (docs/gateway.md).
- :mod:`.models` (a package): where a policy's model lives and how it is loaded.
- :mod:`.policies` (a package): data-algorithm policies between topics (docs/policies.md).
- :mod:`.producers` (a package): task sources, produced to ``tasks.raw``.
- :mod:`.run` (a package): running an experiment on one host (`astraflow run`).
- :mod:`.sim` (a package): replay a workload through a simulated engine and trainer.
- :mod:`.weights` (a package): weight codec, stores, publisher and syncer (docs/weights.md)."""

__version__ = "0.1.0"
