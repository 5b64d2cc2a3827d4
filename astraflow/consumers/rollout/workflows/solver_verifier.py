"""``solver_verifier``: the solver answers, the verifier approves or rejects, a reject earns the
solver one retry with the verdict in its context; the final answer counts.

Roles ``solver`` and ``verifier`` are policies (``policies`` maps them). The verifier gets
``verifier_prompt`` (``{problem}``, ``{answer}``) and ends with ``VERDICT: approve`` or
``VERDICT: reject``; on a reject the solver answers again in the same conversation, after
``retry_prompt`` (``{verdict}``, ``{problem}``, ``{check}``). Two trajectories, rewarded by the
reward contract (default: solver ``final``, verifier ``verdict_correct``).

With ``verifier_tool`` (e.g. ``calculator``) the verifier checks with a tool: its first turn
writes the computation, the tool computes the first arithmetic expression in it, and the
verifier gives its verdict after ``tool_prompt`` (``{expression}``, ``{output}``, ``{answer}``,
``{problem}``), or with ``tool_verdict`` the verdict is whether the claim equals the tool's
answer. ``answer_extract`` (an extractor of ``rollout.reward.extract``, e.g.
``last_number``) puts the solver's extracted answer, not its whole text, into the verifier's
prompts. The format and the options: docs/rollout.md, "Several policies in one episode".
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.context import Draft, EpisodeContext
from astraflow.consumers.rollout.latency import Latency, parse_latency, wait
from astraflow.consumers.rollout.rewards.extract import EXTRACTORS
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
TOOL_PROMPT = ("The calculator computed {expression} = {output}. The proposed answer is {answer}. "
               "Is the proposed answer correct? Reply with one word: yes or no.")

#: an arithmetic expression in a verifier's text: numbers joined by + - * / (parentheses kept
#: around a number); the first one is what ``verifier_tool`` computes
EXPRESSION = re.compile(r"\(*-?\d+(?:\.\d+)?\)*(?:\s*[-+*/]\s*\(*-?\d+(?:\.\d+)?\)*)+")

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


def first_expression(text: str) -> str | None:
    """The first arithmetic expression in ``text`` (``"so 8 - 0 = 8"`` -> ``"8 - 0"``), or
    None."""
    m = EXPRESSION.search(text)
    return m.group(0).strip() if m else None


async def _check_with(ctx: EpisodeContext, tool: str, text: str) -> tuple[str, str, str | None]:
    """Run ``tool`` on the first arithmetic expression of the verifier's ``text``: (the
    expression, what the verifier is told, the tool's answer or None when there is none)."""
    expression = first_expression(text)
    if expression is None:
        ctx.count("check_no_expression")
        return "?", "nothing (no arithmetic expression was written)", None
    result = await ctx.call_tool(tool, {"expression": expression})
    return expression, result.output, result.output if result.ok else None


def same_number(a: str, b: str) -> bool:
    """Whether texts ``a`` and ``b`` are the same number (``"8"`` and ``"8.0"``); a text that
    is no number is the same as nothing."""
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    except ValueError:
        return False


def _untrain(conv: Any, n: int) -> None:
    """Keep the last ``n`` tokens of ``conv`` as context only: loss mask 0, no logprob, no
    version."""
    if n:
        conv.loss_mask[-n:] = [0] * n
        conv.logprobs[-n:] = [0.0] * n
        conv.versions[-n:] = [-1] * n


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
                          verifier_tool: str | None = None, tool_prompt: str = TOOL_PROMPT,
                          check_max_new_tokens: int | None = None,
                          answer_extract: str | None = None, tool_verdict: bool = False,
                          **sampling: Any) -> list[Draft]:
    """See the module docstring. ``policies``: role -> policy (default: the role's name);
    ``rewards``: role -> contract clause overrides; ``role_sampling``: role -> sampling
    overrides; ``verifier_latency``: a delay after the verifier's turn; ``verifier_tool``: the
    tool the verifier checks with (its ``check_max_new_tokens``: the check turn's budget,
    default the verifier's; ``tool_verdict``: the verdict is whether the claim equals the
    tool's answer, with no verdict turn); ``answer_extract``: what of the solver's answer the verifier
    sees; other keyword arguments are sampling overrides for both roles."""
    latency = parse_latency(verifier_latency,
                            where=f"rollout.workflow.kwargs.{NAME}.verifier_latency")
    contract, pol = start_team(ctx, NAME, policies, rewards)

    solver = ctx.conversation(task.prompt, policy=pol["solver"])
    first = await solver.generate(**sampling_for("solver", sampling, role_sampling))
    claim = first.text if answer_extract is None else EXTRACTORS.resolve(answer_extract)(
        first.text).strip() or first.text
    verifier = ctx.conversation([ChatMessage(role="user", content=verifier_prompt.format(
        problem=problem_text(task), answer=claim))], policy=pol["verifier"])
    verifier_sampling = sampling_for("verifier", sampling, role_sampling)
    check = ""  # "expression = output" of a tool check, for the retry prompt's {check}
    checked: str | None = None  # the tool's answer to the verifier's check
    if verifier_tool is None:
        judgement = await verifier.generate(**verifier_sampling)
        if not train_verifier_work:
            _mask_before_last_line(verifier, judgement.token_ids)
        verdict_text = judgement.text
        verdict = parse_verdict(verdict_text)
    else:
        written = await verifier.generate(**(verifier_sampling if check_max_new_tokens is None
                                             else {**verifier_sampling,
                                                   "max_new_tokens": check_max_new_tokens}))
        if not train_verifier_work:
            _untrain(verifier, len(written.token_ids))
        expression, output, checked = await _check_with(ctx, verifier_tool, written.text)
        check = f"{expression} = {output}"
        if tool_verdict:  # the claim against the tool's answer; no check, no verdict
            verdict_text = check
            verdict = None if checked is None else same_number(checked, claim)
        else:
            verifier.add(ChatMessage(role="user", content=tool_prompt.format(
                expression=expression, output=output, answer=claim.strip(),
                problem=problem_text(task))))
            verdict_text = (await verifier.generate(**verifier_sampling)).text
            verdict = parse_verdict(verdict_text)
    if latency is not None:
        waited = await wait(latency, random.Random(f"{task.id}/{ctx.sample_index}"))
        ctx.timings["verifier_latency"] = ctx.timings.get("verifier_latency", 0.0) + waited
        ctx.count("verifier_latency_waits")
        ctx.count("verifier_latency_s", waited)
    if verdict is None:
        ctx.count("verdict_unclear")
    judged = (await ctx.reward(first.text)).value
    work: float | None
    if verifier_tool is not None:  # the verifier's work is its check: the tool's answer
        work = (await ctx.reward(checked)).value if checked is not None else 0.0
    else:  # the line before its verdict
        lines = [line for line in verdict_text.splitlines() if line.strip()]
        work = (await ctx.reward(lines[-2])).value if len(lines) > 1 else None

    final = judged
    turns = [(first, judged)]  # each solver generation and its turn's reward
    retried = verdict is False and retry
    if retried:
        ctx.count("verifier_retries")
        solver.add(ChatMessage(role="user", content=retry_prompt.format(
            verdict=verdict_text, problem=problem_text(task), check=check)))
        second = await solver.generate(**sampling_for("solver", sampling, role_sampling))
        final = (await ctx.reward(second.text)).value
        turns.append((second, final))
        if not train_retry:  # the retry stays in the trajectory as context, masked 0
            _untrain(solver, len(second.token_ids))

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
