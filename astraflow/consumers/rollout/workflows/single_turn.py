"""``single_turn``: one generation for the task's prompt, scored by the configured reward."""

from __future__ import annotations

from typing import Any

from astraflow.consumers.rollout.context import Draft, EpisodeContext
from astraflow.consumers.rollout.workflows.base import WORKFLOWS
from astraflow.core.records import Task


@WORKFLOWS.register("single_turn")
async def single_turn(ctx: EpisodeContext, task: Task, **sampling: Any) -> Draft:
    """Prompt = the task's messages through the chat template; reward(completion text,
    task.reference). Keyword arguments are sampling overrides (temperature, max_new_tokens...)."""
    gen = await ctx.generate(messages=task.prompt, **sampling)
    return gen.conversation.finish(await ctx.reward(gen.text))
