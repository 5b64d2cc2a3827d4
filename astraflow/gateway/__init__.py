"""The agent gateway (``astraflow serve``): an OpenAI-compatible HTTP endpoint over the current
policy that records every call of an agent's session as exact tokens and turns a rewarded,
ended session into Trajectory records (docs/gateway.md).

Modules:

- :mod:`.agent_workflow`: ``openai_agent``: a user's agent written only against the OpenAI SDK,
  trained as it is.
- :mod:`.app`: The HTTP API (FastAPI): OpenAI's routes under ``/v1`` and under
  ``/sessions/{id}/v1``, the session routes, and every error in OpenAI's shape.
- :mod:`.auth`: Who may call the gateway, and who owns a session.
- :mod:`.build`: Building a gateway from the ``gateway`` section plus what it shares with the run
  and with rollout workers: the engines.
- :mod:`.cache`: A least-recently-used cache bounded by the bytes it holds (and by entries), safe
  to share between threads: the gateway's rendered chat templates.
- :mod:`.calls`: From an OpenAI request to a :class:`~astraflow.gateway.service.CallSpec` and from
  the engine's generations to OpenAI's answer.
- :mod:`.config`: Config section ``gateway``: what ``astraflow serve`` listens on, how it records
  sessions and how much it takes at once.
- :mod:`.connections`: Connections the gateway holds, and for how long: uvicorn's h11 protocol with
  a deadline for a request's headers.
- :mod:`.errors`: Errors the gateway answers, in OpenAI's shape: ``{"error": {"message", "type",
  "param", "code"}}`` with the HTTP status that goes with it.
- :mod:`.guards`: Who may reach the gateway through a browser, and how large a request's head may
  be: two ASGI wrappers that answer before any route.
- :mod:`.limits`: What one request may cost the gateway, checked before the cost is paid: the
  body's size (413, read no further), how long its body may take to arrive.
- :mod:`.local`: The gateway of one rollout worker, inside it: what the ``openai_agent`` workflow
  points a user's OpenAI-SDK agent at.
- :mod:`.messages`: OpenAI chat messages and tools as the text the model reads and writes.
- :mod:`.schemas`: The HTTP API's request and response bodies.
- :mod:`.server`: Serving the app with uvicorn: in the foreground (``astraflow serve``) or on a
  thread.
- :mod:`.service`: The gateway without HTTP: policies and their engines, sampling, sessions,
  idempotency and capacity.
- :mod:`.session`: A session's state, folded from its :class:`~astraflow.core.records.GatewayCall`
  events, and where its next call continues.
- :mod:`.store`: The gateway's sessions and the bus under them: every event is produced and flushed
  before it changes a session.
- :mod:`.stream`: Server-sent events for ``stream: true``: a finished response as OpenAI's chunks,
  then ``data: [DONE]``.
- :mod:`.text`: Generated tokens as the text a client gets.
- :mod:`.trajectory`: A session's calls as trajectories: one per policy and segment, laid out as a
  rollout worker lays out an episode.
"""
