"""Workflows: ``async def workflow(ctx, task, **kwargs) -> Draft | list[Draft]``.

Registered by name (``single_turn``, ``multi_turn_tools``, ``openai_agent`` (a user's agent
written against the OpenAI SDK, through the worker's own gateway: it lives with the gateway,
:mod:`astraflow.gateway.agent_workflow`, named here by its path and imported on first use, so
that rollout never imports the gateway), and the multi-policy
``solver_verifier`` and ``solver_selector`` with their reward contracts in ``contracts``) or
loaded from a user's ``module.path:function`` named in ``rollout.workflow.default`` or
``rollout.workflow.kwargs`` (then tasks may name it too), or in ``Task.workflow`` where
``rollout.workflow.allow_task_paths`` is true (see :meth:`~..runtime.Runtime.workflow`).
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
