"""The `astraflow` command: one module per command or command group (docs/cli.md).

Modules:

- :mod:`.app`: The `astraflow` command.
- :mod:`.bench`: `astraflow bench`: study a workload without the hardware it was recorded on.
- :mod:`.broker`: ``astraflow broker``: a local single-node Apache Kafka for development and tests.
- :mod:`.check`: `astraflow check CONFIG`: every problem of an experiment found before a role
  starts.
- :mod:`.common`: Shared CLI plumbing: the --bus option, error reporting, consoles.
- :mod:`.config_cmd`: `astraflow config show|reference`: the resolved config, and the generated
  reference.
- :mod:`.config_reference`: The configuration reference (docs/config.md), generated from the config
  models themselves.
- :mod:`.demo`: `astraflow demo`: the dataflow spine end to end on the embedded bus.
- :mod:`.evaluate`: `astraflow evaluate CONFIG --policy NAME | --team`: held-out greedy evaluation
  of every weight version of one policy.
- :mod:`.inspect_cmd`: `astraflow inspect TOPIC [--from earliest|latest|P:OFFSET,...] [--limit N]
  [--follow]`: print a topic's records as JSON lines.
- :mod:`.models`: `astraflow models`: bring a model here as a plain safetensors folder.
- :mod:`.plugins`: `astraflow plugins`: every name the registries resolve, per entry-point group,
  with where it comes from.
- :mod:`.policy`: ``astraflow policy CONFIG STAGE``: run one data-algorithm stage processor.
- :mod:`.produce`: ``astraflow produce CONFIG``: produce the experiment's tasks (docs/rollout.md).
- :mod:`.reference`: The CLI reference page (docs/reference/cli.md), generated from the Typer app
  itself.
- :mod:`.replay`: `astraflow replay RUN_DIR`: re-train a finished (or stopped) run from its log and
  check every weight version it published, bit for bit.
- :mod:`.retrain`: `astraflow retrain RUN_DIR --set trainer.… --out NEW` and `astraflow compare
  RUN_A RUN_B`.
- :mod:`.rollout`: ``astraflow rollout CONFIG``: run one rollout worker (docs/rollout.md).
- :mod:`.run`: `astraflow run CONFIG`: every role of an experiment as its own process on this host.
- :mod:`.scale`: ``astraflow report CONFIG`` and ``astraflow scale CONFIG``: the reporter and the
  scaler as processes of their own (docs/elastic.md).
- :mod:`.serve`: ``astraflow serve CONFIG``: the agent gateway, an OpenAI-compatible endpoint over
  the run's current policy (docs/gateway.md).
- :mod:`.top`: `astraflow top`: the live view of any running experiment, from its metrics topic.
- :mod:`.topics`: `astraflow topics`: create, list and describe topics on a bus.
- :mod:`.train`: ``astraflow train CONFIG --policy NAME``: run the trainer of one policy.
- :mod:`.weights`: `astraflow weights`: diff, apply and inspect weight files; benchmark the codec;
  serve and mirror blobs.
"""
