"""Workflows: ``async def workflow(ctx, task, **kwargs) -> Draft | list[Draft]``.

Registered by name (``single_turn``, ``multi_turn_tools``) or loaded from a user's
``module.path:function`` named in ``Task.workflow`` or ``rollout.workflow.default``.
"""

from astraflow.consumers.rollout.workflows import multi_turn, single_turn  # noqa: F401  (register)
from astraflow.consumers.rollout.workflows.base import WORKFLOWS

__all__ = ["WORKFLOWS"]
