"""A session's calls as trajectories: one per policy and segment, laid out as a rollout worker
lays out an episode (:class:`~astraflow.consumers.rollout.context.Conversation`).

:func:`drafts` is the one layout, shared by both ways a session ends: :func:`trajectories`
stamps its drafts into Trajectory records (``astraflow serve``), and the ``openai_agent``
workflow returns them to the worker. ``loss_mask`` is 1 exactly over the tokens the model
generated; ids are ``{group_id}/{policy}/{sample_index}`` (``.1``, ``.2``, ... for later
segments), so a session produced twice gives duplicates the assembler drops. The layout:
docs/gateway.md#sessions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from astraflow.consumers.rollout.context import Draft
from astraflow.core.records import Trajectory, TurnSpan, pack_f32, pack_i32, pack_u8
from astraflow.gateway.session import Session, layout


def drafts(s: Session) -> list[Draft]:
    """The drafts of ``s``: per policy (in the order of their first call), its segments in
    order; reward ``s.reward`` (0 if none) and ``s.rewards``, agent ``s.agent``."""
    out = []
    for policy in s.policies():
        for last in s.segments(policy).values():
            chain = s.chain(last)
            seq, _, links = layout(chain)
            mask: list[int] = []
            logprobs: list[float] = []
            versions: list[int] = []
            spans: list[TurnSpan] = []
            pos = 0
            for link in links:
                c = link.call
                n = len(c.prompt_ids)
                if n:
                    spans.append(TurnSpan(start=pos, end=pos + n, role=c.prompt_role))
                mask += [0] * n
                logprobs += [0.0] * n
                versions += [-1] * n
                ch = c.choices[link.choice]
                m = len(ch.token_ids)
                if m:
                    spans.append(TurnSpan(start=link.prompt_end, end=link.end, role="assistant"))
                mask += [1] * m
                logprobs += ch.logprobs
                versions += ch.versions
                pos = link.end
            out.append(Draft(policy=policy, token_ids=seq, loss_mask=mask, logprobs=logprobs,
                             versions=versions, prompt_len=len(chain[0].prompt_ids),
                             spans=spans, reward=0.0 if s.reward is None else s.reward,
                             rewards=dict(s.rewards),
                             finish_reason=("abandoned" if s.end_reason == "abandoned" else
                                            chain[-1].choices[0].finish_reason),
                             agent=s.agent))
    return out


def trajectories(s: Session, *, worker_id: str = "", version_vector: Mapping[str, int] | None = None
                 ) -> list[Trajectory]:
    """The Trajectory records of ``s`` (its reward: ``s.reward``, 0 if none)."""
    out = []
    seen: dict[str, int] = {}
    for d in drafts(s):
        k = seen[d.policy] = seen.get(d.policy, -1) + 1
        out.append(Trajectory(
            id=f"{s.group_id}/{d.policy}/{s.sample_index}" + (f".{k}" if k else ""),
            task_id=s.task_id, group_id=s.group_id, policy=d.policy, agent=d.agent,
            sample_index=s.sample_index, group_size=s.group_size,
            token_ids=pack_i32(d.token_ids), loss_mask=pack_u8(d.loss_mask),
            logprobs=pack_f32(d.logprobs), versions=pack_i32(d.versions),
            prompt_len=d.prompt_len, spans=d.spans, reward=d.reward, rewards=d.rewards,
            turn_rewards=d.turn_rewards,
            finish_reason=d.finish_reason,  # type: ignore[arg-type]
            worker_id=worker_id, version_vector=dict(version_vector or {}),
            timings={"total": max(0.0, time.time() - s.opened_at)}))
    return out
