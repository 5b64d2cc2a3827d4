"""The agent gateway (``astraflow serve``): an OpenAI-compatible HTTP endpoint over the current
policy that records every call of an agent's session as exact tokens and turns a rewarded,
ended session into Trajectory records (docs/gateway.md).

Modules: :mod:`.config` (the ``gateway`` section), :mod:`.schemas` (the API's bodies),
:mod:`.messages` (chat messages and tools as text), :mod:`.session` (a session's state and
where a call continues), :mod:`.trajectory` (a session as trajectories), :mod:`.store`
(sessions on the bus), :mod:`.service` (the gateway without HTTP), :mod:`.calls` (the two
completion routes), :mod:`.text` / :mod:`.stream` (answers and SSE), :mod:`.app` (FastAPI),
:mod:`.server` (uvicorn), :mod:`.build` (from the config). FastAPI and uvicorn are imported
only by :mod:`.app` and :mod:`.server` (``pip install 'astraflow[gateway]'``).
"""
