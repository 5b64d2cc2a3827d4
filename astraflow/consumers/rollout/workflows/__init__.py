"""Workflows: ``async def workflow(ctx, task, **kwargs) -> Draft | list[Draft]``.

Registered by name (``single_turn``, ``multi_turn_tools``, ``solver_verifier``,
``solver_selector``, and ``openai_agent``, which lives with the gateway in
:mod:`astraflow.gateway.agent_workflow` and is imported on first use) or loaded from a user's
``module.path:function`` named in ``rollout.workflow.default`` or ``rollout.workflow.kwargs``
(tasks may then name it too) or, where ``rollout.workflow.allow_task_paths`` is true, in
``Task.workflow`` (see :meth:`~..runtime.Runtime.workflow`).

Modules:

- :mod:`.base`: the workflow registry.
- :mod:`.contracts`: reward contracts: which reward each role of a multi-policy workflow gets.
- :mod:`.multi_turn`: ``multi_turn_tools``: tool calls through a text protocol.
- :mod:`.roles`: what the multi-policy workflows share.
- :mod:`.single_turn`: ``single_turn``: one generation, scored by the reward.
- :mod:`.solver_selector`: ``solver_selector``: ``k`` candidates, a selector picks one.
- :mod:`.solver_verifier`: ``solver_verifier``: a verifier's reject earns the solver a retry.
"""

from astraflow.consumers.rollout.workflows import (  # noqa: F401  (register)
    multi_turn,
    single_turn,
    solver_selector,
    solver_verifier,
)
from astraflow.consumers.rollout.workflows.base import WORKFLOWS

WORKFLOWS.add("openai_agent", "astraflow.gateway.agent_workflow:openai_agent")

__all__ = ["WORKFLOWS"]
