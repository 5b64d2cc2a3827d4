"""What the multi-policy workflows share: roles mapped to policies, the problem's text, and
finishing a role's conversation with its contract reward (and feeding the contract check)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from astraflow.consumers.rollout.context import Conversation, Draft, EpisodeContext, WorkflowError
from astraflow.consumers.rollout.workflows.contracts import (
    CHECK,
    Outcome,
    RewardContract,
    resolve_contract,
)
from astraflow.core.records import Task


def role_policies(ctx: EpisodeContext, workflow: str, roles: Sequence[str],
                  policies: Mapping[str, str] | None) -> dict[str, str]:
    """Role -> policy name: each role's own name unless ``policies`` (the workflow's
    ``policies`` kwarg) maps it elsewhere. Every policy must have an engine in this worker.
    The mapping is declared on the episode (``ctx.declare_roles``): a failed or timed-out
    episode then still gives every role its record."""
    where = f"rollout.workflow.kwargs.{workflow}.policies"
    unknown = sorted(set(policies or {}) - set(roles))
    if unknown:
        raise WorkflowError(f"{where}: workflow {workflow!r} has no role "
                            f"{', '.join(map(repr, unknown))}; roles: {', '.join(roles)}")
    out = {role: str((policies or {}).get(role, role)) for role in roles}
    for role, policy in out.items():
        if policy not in ctx.policies:
            raise WorkflowError(
                f"workflow {workflow!r} role {role!r} uses policy {policy!r}, which has no "
                f"engine in this worker; hosted: {', '.join(ctx.policies)} (add it to "
                f"rollout.policies or map the role with {where}.{role})")
    ctx.declare_roles(out)
    return out


def start_team(ctx: EpisodeContext, workflow: str, policies: Mapping[str, str] | None,
               rewards: Mapping[str, Any] | None) -> tuple[RewardContract, dict[str, str]]:
    """What every multi-policy episode does first: its reward contract (the registered one
    with the workflow's ``rewards`` overrides), declared to the degenerate-contract check,
    and its roles mapped to hosted policies (:func:`role_policies`)."""
    contract = resolve_contract(workflow, rewards)
    CHECK.declare(contract)
    return contract, role_policies(ctx, workflow, tuple(contract.roles), policies)


def problem_text(task: Task) -> str:
    """The task's prompt as plain text for another role's prompt (system messages left out)."""
    return "\n".join(m.content for m in task.prompt if m.role != "system")


def sampling_for(role: str, shared: Mapping[str, Any],
                 per_role: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """Sampling overrides of one role's calls: the shared ones, then ``role_sampling[role]``."""
    return {**shared, **dict((per_role or {}).get(role, {}))}


def finish_role(ctx: EpisodeContext, contract: RewardContract, role: str, conv: Conversation,
                outcome: Outcome, components: Mapping[str, float] | None = None, *,
                turn_rewards: Sequence[float] | None = None) -> Draft:
    """``conv``'s trajectory with ``role``'s contract reward, as role ``role``
    (``Trajectory.agent``: the assembler groups and normalises each role apart, even when one
    policy plays two); the reward is also shown to the degenerate-contract check under the
    task's group. ``turn_rewards``: one reward per assistant turn of ``conv``, to train each
    turn on its own (the trajectory's reward stays the contract's)."""
    if ctx.roles.get(role, conv.policy) != conv.policy:
        raise WorkflowError(f"workflow {contract.workflow!r} finished a conversation of policy "
                            f"{conv.policy!r} as role {role!r}, which policy "
                            f"{ctx.roles[role]!r} plays")
    reward = contract.reward(role, outcome)
    CHECK.observe(contract.workflow, role, ctx.task.resolved_group_id(), ctx.task.n_samples,
                  ctx.sample_index, reward)
    return conv.finish(reward, rewards={**(components or {}), "final_answer": outcome.final},
                       agent=role, turn_rewards=turn_rewards)
