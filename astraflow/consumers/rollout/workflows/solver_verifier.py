"""``solver_verifier``: the solver answers, the verifier approves or rejects, a reject earns the
solver one retry with the verdict in its context; the final answer counts.

Roles ``solver`` and ``verifier`` are policies (``policies`` maps them). The verifier gets
``verifier_prompt`` (``{problem}``, ``{answer}``) and ends with ``VERDICT: approve`` or
``VERDICT: reject``; on a reject the solver answers again in the same conversation, after
``retry_prompt`` (``{verdict}``, ``{problem}``). Two trajectories, rewarded by the reward
contract (default: solver ``final``, verifier ``verdict_correct``). The verdict format and the
options: docs/rollout.md, "Several policies in one episode".
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.context import Draft, EpisodeContext
from astraflow.consumers.rollout.latency import Latency, parse_latency, wait
from astraflow.consumers.rollout.workflows.base import WORKFLOWS
from astraflow.consumers.rollout.workflows.contracts import (
    RIGHT_RATE,
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

NAME = "solver_verifier"
CONTRACT = register_contract(RewardContract(
    NAME, {"solver": RoleReward("final"), "verifier": RoleReward("verdict_correct")},
    provides=frozenset({"verdict", "work"})))

VERIFIER_PROMPT = ("Problem:\n{problem}\n\nProposed answer:\n{answer}\n\nIs the proposed answer "
                   "correct? Explain briefly, then end with 'VERDICT: approve' or "
                   "'VERDICT: reject'.")
RETRY_PROMPT = "A verifier rejected your answer:\n{verdict}\nTry again."

_APPROVE = {"approve", "approved", "yes", "correct", "accept"}
_REJECT = {"reject", "rejected", "no", "incorrect", "wrong"}
_TAGGED = re.compile(r"verdict\s*:\s*\**\s*([a-z]+)", re.IGNORECASE)
_BARE = re.compile(r"^[\s*_`'\"(\[]*([a-z]+)[\s*_`'\".!)\]]*$", re.IGNORECASE)


def parse_verdict(text: str) -> bool | None:
    """True (approve), False (reject) or None (unclear) — see the module docstring."""
    tagged = _TAGGED.findall(text)
    if tagged:
        word = tagged[-1].lower()
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        bare = _BARE.match(lines[-1]) if lines else None
        word = bare.group(1).lower() if bare else ""
    return True if word in _APPROVE else False if word in _REJECT else None


def _mask_before_last_line(conv: Any, ids: list[int]) -> None:
    """Untrain the tokens of the verifier's turn before its last line (its work), keeping the
    verdict line trained: the shortest suffix of the turn that decodes to text containing a
    newline starts right after the work."""
    tok = conv.tokenizer
    keep = len(ids)
    for k in range(len(ids) - 1, -1, -1):
        if "\n" in tok.decode(ids[k:], skip_special_tokens=True):
            keep = len(ids) - k - 1  # the newline's token is work too
            break
    else:
        return  # one line: all of it is the verdict
    start = len(conv.loss_mask) - len(ids)
    for i in range(start, len(conv.loss_mask) - keep):
        conv.loss_mask[i], conv.logprobs[i], conv.versions[i] = 0, 0.0, -1


@WORKFLOWS.register(NAME)
async def solver_verifier(ctx: EpisodeContext, task: Task, *, retry: bool = True,
                          train_retry: bool = True, turn_rewards: bool = False,
                          train_verifier_work: bool = True,
                          verifier_prompt: str = VERIFIER_PROMPT,
                          retry_prompt: str = RETRY_PROMPT, correct_threshold: float = 0.5,
                          policies: Mapping[str, str] | None = None,
                          rewards: Mapping[str, Any] | None = None,
                          role_sampling: Mapping[str, Mapping[str, Any]] | None = None,
                          verifier_latency: Latency | Mapping[str, Any] | float | None = None,
                          **sampling: Any) -> list[Draft]:
    """See the module docstring. ``policies``: role -> policy (default: the role's name);
    ``rewards``: role -> contract clause overrides; ``role_sampling``: role -> sampling
    overrides; ``verifier_latency``: a delay after the verifier's turn; other keyword
    arguments are sampling overrides for both roles."""
    latency = parse_latency(verifier_latency,
                            where=f"rollout.workflow.kwargs.{NAME}.verifier_latency")
    contract, pol = start_team(ctx, NAME, policies, rewards)

    solver = ctx.conversation(task.prompt, policy=pol["solver"])
    first = await solver.generate(**sampling_for("solver", sampling, role_sampling))
    verifier = ctx.conversation([ChatMessage(role="user", content=verifier_prompt.format(
        problem=problem_text(task), answer=first.text))], policy=pol["verifier"])
    judgement = await verifier.generate(**sampling_for("verifier", sampling, role_sampling))
    if not train_verifier_work:
        _mask_before_last_line(verifier, judgement.token_ids)
    if latency is not None:
        waited = await wait(latency, random.Random(f"{task.id}/{ctx.sample_index}"))
        ctx.timings["verifier_latency"] = ctx.timings.get("verifier_latency", 0.0) + waited
        ctx.count("verifier_latency_waits")
        ctx.count("verifier_latency_s", waited)
    verdict = parse_verdict(judgement.text)
    if verdict is None:
        ctx.count("verdict_unclear")
    judged = (await ctx.reward(first.text)).value
    lines = [line for line in judgement.text.splitlines() if line.strip()]
    work = (await ctx.reward(lines[-2])).value if len(lines) > 1 else None

    final = judged
    turns = [(first, judged)]  # each solver generation and its turn's reward
    retried = verdict is False and retry
    if retried:
        ctx.count("verifier_retries")
        solver.add(ChatMessage(role="user", content=retry_prompt.format(
            verdict=judgement.text, problem=problem_text(task))))
        second = await solver.generate(**sampling_for("solver", sampling, role_sampling))
        final = (await ctx.reward(second.text)).value
        turns.append((second, final))
        if not train_retry:  # the retry stays in the trajectory as context, masked 0
            n = len(second.token_ids)
            solver.loss_mask[-n:] = [0] * n
            solver.logprobs[-n:] = [0.0] * n
            solver.versions[-n:] = [-1] * n

    rate = RIGHT_RATE.update(judged >= correct_threshold)
    outcome = Outcome(final=final, threshold=correct_threshold, judged=judged, verdict=verdict,
                      right_rate=rate, work=work)
    approved = -1.0 if verdict is None else float(verdict)
    return [finish_role(ctx, contract, "solver", solver, outcome,
                        {"first_answer": judged, "retried": float(retried)},
                        turn_rewards=[r for g, r in turns if g.token_ids]
                        if turn_rewards else None),
            finish_role(ctx, contract, "verifier", verifier, outcome,
                        {"approved": approved, "judged_answer": judged,
                         "work_answer": -1.0 if work is None else work})]
