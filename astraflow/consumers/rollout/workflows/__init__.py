"""Workflows: ``async def workflow(ctx, task, **kwargs) -> Draft | list[Draft]``.

Registered by name (``single_turn``, ``multi_turn_tools``, ``openai_agent`` (a user's agent
written against the OpenAI SDK, through the worker's own gateway: it lives with the gateway,
:mod:`astraflow.gateway.agent_workflow`, named here by its path and imported on first use, so
that rollout never imports the gateway), and the multi-policy
``solver_verifier`` and ``solver_selector`` with their reward contracts in ``contracts``) or
loaded from a user's ``module.path:function`` named in ``rollout.workflow.default`` or
``rollout.workflow.kwargs`` (then tasks may name it too), or in ``Task.workflow`` where
``rollout.workflow.allow_task_paths`` is true (see :meth:`~..runtime.Runtime.workflow`).

Modules:

- :mod:`.base`: The workflow registry (its own module so workflows can import it without cycles).
- :mod:`.contracts`: Reward contracts: which scalar each role of a multi-policy workflow gets, and
  from what.
- :mod:`.multi_turn`: ``multi_turn_tools``: the model calls tools through a text protocol until it
  answers.
- :mod:`.roles`: What the multi-policy workflows share: roles mapped to policies, the problem's
  text, and finishing a role's conversation with its contract reward.
- :mod:`.single_turn`: ``single_turn``: one generation for the task's prompt, scored by the
  configured reward.
- :mod:`.solver_selector`: ``solver_selector``: the solver samples ``k`` candidate answers, the
  selector picks one; the picked answer counts.
- :mod:`.solver_verifier`: ``solver_verifier``: the solver answers, the verifier approves or
  rejects, a reject earns the solver one retry with the verdict in its context.
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
