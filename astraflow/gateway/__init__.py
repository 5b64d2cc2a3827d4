"""The agent gateway (``astraflow serve``): an OpenAI-compatible HTTP endpoint over the current
policy that records every call of an agent's session as exact tokens and turns a rewarded,
ended session into Trajectory records (docs/gateway.md).

Modules:

- :mod:`.agent_workflow`: ``openai_agent``: an OpenAI-SDK agent trained as it is.
- :mod:`.app`: the HTTP API (FastAPI): routes and OpenAI-shaped errors.
- :mod:`.auth`: who may call the gateway, and who owns a session.
- :mod:`.build`: a gateway from the ``gateway`` section and the run's engines.
- :mod:`.cache`: a thread-safe LRU cache bounded by bytes: rendered chat templates.
- :mod:`.calls`: OpenAI requests to call specs, generations to OpenAI's answers.
- :mod:`.config`: config section ``gateway``.
- :mod:`.connections`: the connections the gateway holds, and for how long.
- :mod:`.errors`: errors in OpenAI's shape, with their HTTP status.
- :mod:`.guards`: browser origins and request-head size, checked before any route.
- :mod:`.limits`: what one request may cost, checked before the cost is paid.
- :mod:`.local`: a rollout worker's own gateway, for ``openai_agent``.
- :mod:`.messages`: OpenAI chat messages and tools as the model's text.
- :mod:`.schemas`: the HTTP API's request and response bodies.
- :mod:`.server`: serving the app with uvicorn, in the foreground or on a thread.
- :mod:`.service`: the gateway without HTTP: policies, engines, sessions, capacity.
- :mod:`.session`: a session's state, and where its next call continues.
- :mod:`.store`: the sessions and the bus under them.
- :mod:`.stream`: server-sent events for ``stream: true``.
- :mod:`.text`: generated tokens as the text a client gets.
- :mod:`.trajectory`: a session's calls as Trajectory records.
"""
