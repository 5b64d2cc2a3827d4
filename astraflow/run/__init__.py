"""Running an experiment on one host: the supervisor behind `astraflow run`, the metrics
collector that writes `metrics.jsonl`, the live view (`astraflow top`) and the end-of-run plots.

Modules:

- :mod:`.accounting`: Where every trajectory of a run ended: trained, waiting, or filtered.
- :mod:`.breakdown`: A run's wall time per role, broken down into its phases.
- :mod:`.check`: ``astraflow check CONFIG``: what would fail at runtime, found before the run.
- :mod:`.collector`: Reads the run's ``metrics`` topic and writes ``metrics.jsonl``.
- :mod:`.compare`: `astraflow compare RUN_A RUN_B`: two runs' curves and metrics side by side.
- :mod:`.exits`: The exit codes of `astraflow` (docs/cli.md).
- :mod:`.lag`: Bus lag of the run's consumer groups.
- :mod:`.launch`: What `astraflow run` launches: roles, SFT warm-up, export of trained weights.
- :mod:`.memory`: A rough memory estimate of a policy's trainer and engines (no torch).
- :mod:`.orchestrate`: `astraflow run`, step by step: run directory, warm-up, RL phase.
- :mod:`.plots`: End-of-run plots (PNG) and a summary table from ``metrics.jsonl``.
- :mod:`.progress`: Progress lines while `astraflow run` has no live view to draw.
- :mod:`.replay`: `astraflow replay RUN_DIR`: re-train a run from its log, check every version.
- :mod:`.resources`: What an experiment config points at, opened: its bus and model directories.
- :mod:`.retrain`: `astraflow retrain RUN_DIR`: a counterfactual trained on a run's data.
- :mod:`.roles`: Each role built from the experiment config.
- :mod:`.scaling`: The scaler inside `astraflow run` (``scale.enabled``).
- :mod:`.supervisor`: Starts every role as its own OS process, watches and restarts them.
- :mod:`.trainer_memory`: The trainer's memory per rank, from the model's shape and the setup.
- :mod:`.view`: The live terminal view of a run (rich).
- :mod:`.warmup`: The SFT warm-up phase of `astraflow run`, and where it stops.
- :mod:`.warmup_checks`: The checks of a warm-up to a target accuracy band.
- :mod:`.sinks` (a package): Metric sinks besides ``metrics.jsonl``: TensorBoard, wandb.
"""
