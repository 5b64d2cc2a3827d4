"""Running an experiment on one host: the supervisor behind `astraflow run`, the metrics
collector that writes `metrics.jsonl`, the live view (`astraflow top`) and the end-of-run plots.

Modules:

- :mod:`.accounting`: Where every trajectory of a run ended: trained on, waiting, or filtered with
  a reason.
- :mod:`.breakdown`: Where every second goes: a run's wall time per role, broken down into its
  phases.
- :mod:`.check`: ``astraflow check CONFIG``: what would fail at runtime, found before any role
  starts.
- :mod:`.collector`: Reads the run's ``metrics`` topic: the newest snapshot of every process,
  rates, and the lines of ``metrics.jsonl``.
- :mod:`.compare`: `astraflow compare RUN_A RUN_B`: two runs' held-out curves and train metrics,
  side by side.
- :mod:`.exits`: The exit codes of `astraflow` (docs/cli.md): what a script running a command can
  branch on.
- :mod:`.lag`: Bus lag of the run's consumer groups: how much input each stage has not yet
  committed.
- :mod:`.launch`: What `astraflow run` launches: the roles of an experiment, the SFT warm-up phase,
  and the export of trained weights to a Hugging Face model directory.
- :mod:`.memory`: A rough memory estimate of one policy's trainer and engines, from the model's
  config.json and the run's settings (for `astraflow check`; no torch).
- :mod:`.orchestrate`: `astraflow run`, step by step: prepare the run directory and models, the
  optional SFT warm-up phase, the RL phase with every role supervised.
- :mod:`.plots`: End-of-run plots (PNG) and a summary table from ``metrics.jsonl``.
- :mod:`.progress`: Progress without a terminal: one plain line every ``launch.progress_every_s``
  seconds while `astraflow run` has no live view to draw.
- :mod:`.replay`: `astraflow replay RUN_DIR`: re-train a run's policies from its log and check
  every version.
- :mod:`.resources`: What an experiment config points at, opened: its bus (with the run's topics)
  and each policy's model directory.
- :mod:`.retrain`: `astraflow retrain RUN_DIR --set trainer.… --out NEW`: a counterfactual trained
  on a run's data.
- :mod:`.roles`: Each role built from the experiment config: the one place that hands a role its
  own section plus the few values it shares with the run.
- :mod:`.scaling`: The scaler inside `astraflow run` (``scale.enabled``).
- :mod:`.supervisor`: The supervisor behind `astraflow run`: starts every role as its own OS
  process, watches them, restarts the ones that die.
- :mod:`.trainer_memory`: The trainer's memory per rank: a pure function of the model's shape and
  the trainer's setup.
- :mod:`.view`: The live terminal view of a run (rich): shown by `astraflow run` and `astraflow
  top`.
- :mod:`.warmup`: The SFT warm-up phase of `astraflow run`, and where it stops.
- :mod:`.warmup_checks`: The checks of a warm-up to a target band (:mod:`astraflow.run.warmup`):
  where a policy stands against the band.
- :mod:`.sinks` (a package): Metric sinks: where `astraflow run` sends the metrics it collects,
  besides ``metrics.jsonl``.
"""
