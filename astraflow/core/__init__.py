"""The dataflow spine: records, topic names, the bus protocol and its backends, errors.

Only this package talks to Kafka or SQLite.

Modules:

- :mod:`.claims`: Claim checks: records too large for the bus travel as a reference
  (docs/config.md#busclaims).
- :mod:`.commits`: The one commit rule, for every role: a consumer group's committed offset on a
  partition moves past a record only once that record's outputs.
- :mod:`.config`: Loading configuration: YAML + ``--set a.b=c`` overrides → a pydantic model, with
  every problem reported at once.
- :mod:`.cores`: Cores shared by the compute roles of one machine: an idle role lends its cores to
  the busy.
- :mod:`.errors`: The error hierarchy.
- :mod:`.fetch`: Fetching records by address: what a consumer of references does (batches carry
  references to trajectory records, not copies.
- :mod:`.forkserver`: A fork server for the roles that load torch: started once, it imports torch,
  transformers and the roles' modules, then forks each such role.
- :mod:`.gang`: A gang of N rank processes that live and die together: a multi-rank trainer as one
  role.
- :mod:`.jsonl`: Reading a JSON-lines log that a process appends to.
- :mod:`.launcher`: The one launcher of role processes: `astraflow run`'s supervisor and the
  scaler's ``local`` actuator both start, stop and reap their children here.
- :mod:`.limits`: What a Trajectory becomes when it does not fit: the one rule for every producer
  of them.
- :mod:`.metrics`: Heartbeats and metrics: every process emits :class:`Metric` records to
  ``metrics``.
- :mod:`.outoforder`: The runtime's out-of-order mode: consume →.
- :mod:`.outputs`: What a role produces: an :class:`Output` (a record for a topic), :func:`send`
  (produce it, by claim check when it is too large), :class:`OutRecord`.
- :mod:`.paths`: Path templates in config values: ``{out}`` is the run directory, other fields
  (``{policy}``, ``{worker}``) are filled by the code that knows them.
- :mod:`.ports`: Free TCP ports on the loopback interface, for the processes this project starts
  locally (a Kafka broker, a Toxiproxy proxy, a gateway under test).
- :mod:`.prometheus`: A Prometheus endpoint per process, exporting a :class:`MetricsEmitter`'s
  counters and gauges.
- :mod:`.redact`: What counts as a secret, by the name of its key and by the shape of its value,
  and how text (an error, a log line) is shown without one.
- :mod:`.registry`: Name → callable registries: the one idiom of every pluggable part (workflows,
  rewards, tools, engines, policies, actuators, weight stores).
- :mod:`.secrets`: Secrets in config files: which values are secret, how a dump hides them, and the
  one private file that keeps them for the roles.
- :mod:`.stop`: When a long-running loop stops (:class:`Stop`: by count, time or signal) and, for
  crash tests, where it is killed (:class:`FaultPoints`).
- :mod:`.stream`: The one processor runtime: every consume → transform → produce role is a handler
  on it.
- :mod:`.topics`: The one table of topics and consumer groups: names, record types, keys, partition
  counts and group names (docs/reference/topics.md).
- :mod:`.broker` (a package): The local Apache Kafka broker for development and tests (``astraflow
  broker ...``).
- :mod:`.bus` (a package): The bus: ``connect(url)`` gives a :class:`Bus` for the embedded or the
  Kafka backend.
- :mod:`.records` (a package): The wire format: one typed, versioned msgpack schema per record type
  (docs/reference/wire-format.md).
"""
