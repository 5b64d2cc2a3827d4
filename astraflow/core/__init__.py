"""The dataflow spine: records, topic names, the bus protocol and its backends, errors.

Only this package talks to Kafka or SQLite.

Modules:

- :mod:`.claims`: claim checks: a record too large for the bus travels as a reference.
- :mod:`.commits`: the one commit rule: an offset moves past a record once its outputs are flushed.
- :mod:`.config`: loading configuration: YAML + ``--set a.b=c`` overrides → a pydantic model.
- :mod:`.cores`: cores shared by the compute roles of one host.
- :mod:`.errors`: the error hierarchy.
- :mod:`.fetch`: fetching records by address, for consumers of references.
- :mod:`.forkserver`: a fork server that imports torch once and forks the roles that load it.
- :mod:`.gang`: a gang of N rank processes that live and die together.
- :mod:`.jsonl`: reading a JSON-lines log that a process appends to.
- :mod:`.launcher`: the one launcher of role processes: start, stop, reap.
- :mod:`.limits`: what a Trajectory becomes when it does not fit.
- :mod:`.metrics`: heartbeats and :class:`Metric` records to ``metrics``.
- :mod:`.outoforder`: the runtime's out-of-order mode, for records that finish in any order.
- :mod:`.outputs`: what a role produces: :class:`Output`, :func:`send`, :class:`OutRecord`.
- :mod:`.paths`: path templates in config values (``{out}``, ``{policy}``, ...).
- :mod:`.ports`: free TCP ports on the loopback interface.
- :mod:`.prometheus`: a Prometheus endpoint per process.
- :mod:`.redact`: what counts as a secret, and how text is shown without one.
- :mod:`.registry`: name → callable registries for every pluggable part.
- :mod:`.secrets`: secrets in config files: which values, how a dump hides them.
- :mod:`.stop`: when a long-running loop stops, and fault points for crash tests.
- :mod:`.stream`: the one processor runtime: consume → transform → produce.
- :mod:`.topics`: the one table of topics and consumer groups (docs/reference/topics.md).
- :mod:`.broker` (a package): the local Apache Kafka broker (``astraflow broker ...``).
- :mod:`.bus` (a package): the bus: ``connect(url)`` gives an embedded or Kafka :class:`Bus`.
- :mod:`.records` (a package): the wire format (docs/reference/wire-format.md)."""
