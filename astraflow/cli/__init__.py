"""The `astraflow` command: one module per command or command group (docs/cli.md).

Modules:

- :mod:`.app`: The `astraflow` command.
- :mod:`.bench`: `astraflow bench`: study a workload without the hardware it was recorded on.
- :mod:`.broker`: ``astraflow broker``: a local single-node Apache Kafka.
- :mod:`.check`: `astraflow check CONFIG`: every problem of an experiment, before a role starts.
- :mod:`.common`: Shared CLI plumbing: the --bus option, error reporting, consoles.
- :mod:`.config_cmd`: `astraflow config show|reference`.
- :mod:`.config_reference`: The configuration reference (docs/config.md), generated.
- :mod:`.demo`: `astraflow demo`: the dataflow spine end to end on the embedded bus.
- :mod:`.evaluate`: `astraflow evaluate CONFIG`: held-out evaluation of every weight version.
- :mod:`.inspect_cmd`: `astraflow inspect TOPIC`: print a topic's records as JSON lines.
- :mod:`.models`: `astraflow models`: bring a model here as a plain safetensors folder.
- :mod:`.plugins`: `astraflow plugins`: every name the registries resolve, and where from.
- :mod:`.policy`: ``astraflow policy CONFIG STAGE``: run one data-algorithm stage processor.
- :mod:`.produce`: ``astraflow produce CONFIG``: produce the experiment's tasks.
- :mod:`.reference`: The CLI reference page (docs/reference/cli.md), generated.
- :mod:`.replay`: `astraflow replay RUN_DIR`: re-train a run from its log, bit for bit.
- :mod:`.retrain`: `astraflow retrain RUN_DIR` and `astraflow compare RUN_A RUN_B`.
- :mod:`.rollout`: ``astraflow rollout CONFIG``: run one rollout worker.
- :mod:`.run`: `astraflow run CONFIG`: every role of an experiment as its own process.
- :mod:`.scale`: ``astraflow report CONFIG`` and ``astraflow scale CONFIG``.
- :mod:`.serve`: ``astraflow serve CONFIG``: the agent gateway (docs/gateway.md).
- :mod:`.top`: `astraflow top`: the live view of any running experiment.
- :mod:`.topics`: `astraflow topics`: create, list and describe topics on a bus.
- :mod:`.train`: ``astraflow train CONFIG --policy NAME``: run the trainer of one policy.
- :mod:`.weights`: `astraflow weights`: diff, apply, inspect, serve and mirror weight files.
"""
