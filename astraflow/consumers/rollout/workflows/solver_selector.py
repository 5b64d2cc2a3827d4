"""``solver_selector``: the solver samples ``k`` candidate answers, the selector picks one; the
picked answer counts.

The episode (roles ``solver`` and ``selector``, each a policy; see ``policies``):

1. the solver answers the task's prompt ``k`` times, in ``k`` independent conversations
   (generated concurrently, so the engine batches them);
2. every candidate is scored by the configured reward (for the contract; the selector never
   sees the scores);
3. the selector gets ``selector_prompt`` (``{problem}``, ``{candidates}``: ``1. ...``, ``2. ...``
   one per line, ``{k}``) and ends with ``CHOICE: N`` (1-based; the last one counts; a text
   that is only a number also counts). An unclear or out-of-range choice counts
   ``choice_unclear``: the system's answer falls back to candidate 1 and the ``picked`` rules
   give the selector 0.

Trajectories: one for the selector, and one for the solver: the picked candidate's conversation
(candidate 1 on an unclear pick). Only one, because the pipeline counts one trajectory per
policy per sample (``Trajectory.group_size`` is the task's ``n_samples``), so the other
``k - 1`` candidates are not trained on. An episode cut off by the worker's timeout keeps that
rule too: the candidates are the ``solver`` role's conversations, and a timed-out episode
gives one record per role (the first candidate's, see ``runtime.timed_out_drafts``). Rewards come from the contract (default: solver
``final``, the picked answer's reward; selector ``picked``; override with ``rewards``, e.g.
``{selector: picked_correct}``). Components: ``picked`` (1-based, 0 if unclear), ``best``
(the best candidate's reward), ``final_answer``.
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
