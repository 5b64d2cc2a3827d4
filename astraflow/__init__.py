"""AstraFlow: dataflow-oriented reinforcement learning for LLM agents.

Every component is an independent process that consumes records from durable topics and
produces records to other topics; see docs/architecture.md. The public entry point of the
dataflow is :func:`astraflow.core.bus.connect`.

Modules:

- :mod:`.cli` (a package): The `astraflow` command: one module per command or command group
  (docs/cli.md).
- :mod:`.config` (a package): The experiment config: one YAML file describes an experiment
  (docs/config.md).
- :mod:`.consumers` (a package): Consumers of the dataflow: rollout workers, trainers, evaluators,
  the scaler.
- :mod:`.core` (a package): The dataflow spine: records, topic names, the bus protocol and its
  backends, errors.
- :mod:`.gateway` (a package): The agent gateway (``astraflow serve``): an OpenAI-compatible HTTP
  endpoint over the current policy that records every call of an agent's session as exact tokens
  and turns a rewarded, ended session into Trajectory records (docs/gateway.md).
- :mod:`.models` (a package): Models: where a policy's model lives and how it is loaded.
- :mod:`.policies` (a package): Data-algorithm policies (docs/policies.md): stream processors
  between topics.
- :mod:`.producers` (a package): Task sources: datasets (JSONL, Parquet, Hugging Face datasets),
  reasoning-gym task suites and synthetic arithmetic, produced to ``tasks.raw``.
- :mod:`.run` (a package): Running an experiment on one host: the supervisor behind `astraflow
  run`, the metrics collector that writes `metrics.jsonl`, the live view.
- :mod:`.sim` (a package): Replay a workload through a simulated engine and trainer (``astraflow
  bench replay``).
- :mod:`.weights` (a package): Weights: sparse bf16 delta codec, weight stores, publisher and
  syncer (docs/weights.md).
"""

__version__ = "0.1.0"
