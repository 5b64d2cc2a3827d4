"""Consumers of the dataflow: rollout workers, trainers, evaluators, the scaler.

Modules:

- :mod:`.episodes`: Greedy episodes for evaluation: a run's workflow on held-out problems.
- :mod:`.evaluator`: The evaluator: measures each new version of one policy on held-out data.
- :mod:`.team_evaluator`: The team evaluator: measures a ``solver_verifier`` team's episodes.
- :mod:`.rollout` (a package): Rollout as a service: workers, engines, workflows, rewards, tools.
- :mod:`.scaler` (a package): The scaler: a rollout pool's size from the load reports.
- :mod:`.trainer` (a package): The trainer: GRPO-family RL and SFT as bus consumers.
"""
