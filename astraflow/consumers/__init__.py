"""Consumers of the dataflow: rollout workers, trainers, evaluators, the scaler.

Modules:

- :mod:`.episodes`: Greedy episodes for evaluation: a run's workflow run at temperature 0 on
  held-out problems.
- :mod:`.evaluator`: The evaluator: follows ``weights.<policy>`` and measures each new version of
  one policy on held-out data, greedily (a consumer like any other.
- :mod:`.team_evaluator`: The team evaluator: follows ``weights.<policy>`` of every policy of a
  ``solver_verifier`` team and measures the whole episode on held-out problems.
- :mod:`.rollout` (a package): Rollout as a service: workers, engines, workflows, rewards, tools
  (docs/rollout.md).
- :mod:`.scaler` (a package): The scaler (docs/elastic.md): reads
  :class:`~astraflow.core.records.LoadReport` records from ``reports``.
- :mod:`.trainer` (a package): The trainer: GRPO-family RL and SFT as bus consumers
  (docs/trainer.md).
"""
