"""``solver_selector``: the solver samples ``k`` candidate answers, the selector picks one; the
picked answer counts.

Roles ``solver`` and ``selector`` are policies (see ``policies``). The solver answers ``k``
times, concurrently, and the reward scores every candidate; the selector gets
``selector_prompt`` (``{problem}``, ``{candidates}``, ``{k}``) and ends with ``CHOICE: N``
(1-based). An unclear choice counts ``choice_unclear`` and falls back to candidate 1. Two
trajectories: the selector's, and the picked candidate's conversation (the pipeline counts one
per policy per sample). Rewards come from the contract (default: solver ``final``, selector
``picked``; override with ``rewards``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.context import Draft, EpisodeContext, WorkflowError
from astraflow.consumers.rollout.workflows.base import WORKFLOWS
from astraflow.consumers.rollout.workflows.contracts import (
    Outcome,
    RewardContract,
    RoleReward,
    register_contract,
)
from astraflow.consumers.rollout.workflows.roles import (
    finish_role,
    problem_text,
    sampling_for,
    start_team,
)
from astraflow.core.records import ChatMessage, Task

NAME = "solver_selector"
CONTRACT = register_contract(RewardContract(
    NAME, {"solver": RoleReward("final"), "selector": RoleReward("picked")},
    provides=frozenset({"picked"})))

SELECTOR_PROMPT = ("Problem:\n{problem}\n\nCandidate answers:\n{candidates}\n\nWhich candidate "
                   "is correct? End with 'CHOICE: N' (N from 1 to {k}).")

_CHOICE = re.compile(r"choice\s*:\s*\**\s*(\d+)", re.IGNORECASE)
_BARE = re.compile(r"^\s*(\d+)\s*[.)]?\s*$")


def parse_choice(text: str, k: int) -> int | None:
    """The 0-based index of the picked candidate, or None (unclear or out of 1..k)."""
    found = _CHOICE.findall(text)
    raw = found[-1] if found else (m.group(1) if (m := _BARE.match(text)) else None)
    if raw is None or not 1 <= int(raw) <= k:
        return None
    return int(raw) - 1


@WORKFLOWS.register(NAME)
async def solver_selector(ctx: EpisodeContext, task: Task, *, k: int = 4,
                          selector_prompt: str = SELECTOR_PROMPT,
                          correct_threshold: float = 0.5,
                          policies: Mapping[str, str] | None = None,
                          rewards: Mapping[str, Any] | None = None,
                          role_sampling: Mapping[str, Mapping[str, Any]] | None = None,
                          **sampling: Any) -> list[Draft]:
    """See the module docstring. ``k``: candidates per episode (>= 1); ``policies``,
    ``rewards``, ``role_sampling`` and sampling overrides as in ``solver_verifier``."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise WorkflowError(f"rollout.workflow.kwargs.{NAME}.k = {k!r}; expected an integer "
                            ">= 1 (the candidates the solver samples)")
    contract, pol = start_team(ctx, NAME, policies, rewards)

    solver_sampling = sampling_for("solver", sampling, role_sampling)
    gens = await asyncio.gather(*(ctx.generate(policy=pol["solver"], agent="solver",
                                               messages=task.prompt, **solver_sampling)
                                  for _ in range(k)))
    scores = await asyncio.gather(*(ctx.reward(g.text) for g in gens))
    candidates = tuple(s.value for s in scores)

    listing = "\n".join(f"{i}. {g.text}" for i, g in enumerate(gens, 1))
    selector = ctx.conversation([ChatMessage(role="user", content=selector_prompt.format(
        problem=problem_text(task), candidates=listing, k=k))], policy=pol["selector"],
        agent="selector")
    choice = await selector.generate(**sampling_for("selector", sampling, role_sampling))
    picked = parse_choice(choice.text, k)
    if picked is None:
        ctx.count("choice_unclear")
    shown = 0 if picked is None else picked

    outcome = Outcome(final=candidates[shown], threshold=correct_threshold,
                      candidates=candidates, picked=picked)
    comps = {"picked": 0.0 if picked is None else float(picked + 1), "best": max(candidates)}
    # ctx.generate registered every candidate's conversation; only the shown one is returned
    return [finish_role(ctx, contract, "solver", gens[shown].conversation, outcome, comps),
            finish_role(ctx, contract, "selector", selector, outcome, comps)]
