"""The Trajectory records of a task's episodes: one per policy's draft per sample, with ids
``"{group_id}/{policy}/{sample_index}"`` (``.k`` after the first draft of a policy in one
episode), so that a task redone after a crash produces recognisable duplicates."""

from __future__ import annotations

from collections.abc import Sequence

from astraflow.consumers.rollout.runtime import EpisodeOutcome
from astraflow.core.limits import error_text
from astraflow.core.records import Task, Trajectory, pack_f32, pack_i32, pack_u8


def build_trajectories(task: Task, outcomes: Sequence[EpisodeOutcome], *, worker_id: str,
                       vector: dict[str, int]) -> tuple[list[Trajectory], int]:
    """The trajectories of ``task``'s episodes (``outcomes[i]`` is sample ``i``), all under
    the version ``vector`` (one snapshot: every policy's trajectories of one episode say
    they were produced under the same vector), and the tokens they generated."""
    group = task.resolved_group_id()
    records = []
    tokens = 0
    for index, out in enumerate(outcomes):
        seen: dict[str, int] = {}
        timings = {**out.ctx.timings, "total": out.seconds}
        for d in out.drafts:
            k = seen[d.policy] = seen.get(d.policy, -1) + 1
            suffix = f".{k}" if k else ""
            tokens += sum(d.loss_mask)
            records.append(Trajectory(
                id=f"{group}/{d.policy}/{index}{suffix}", task_id=task.id, group_id=group,
                policy=d.policy, agent=d.agent, sample_index=index,
                group_size=task.n_samples, token_ids=pack_i32(d.token_ids),
                loss_mask=pack_u8(d.loss_mask), logprobs=pack_f32(d.logprobs),
                versions=pack_i32(d.versions), prompt_len=d.prompt_len, spans=d.spans,
                reward=d.reward, rewards=d.rewards, turn_rewards=d.turn_rewards,
                finish_reason=d.finish_reason,  # type: ignore[arg-type]
                error=None if d.error is None else error_text(d.error),
                worker_id=worker_id, version_vector=vector,
                timings=dict(timings)))
    return records, tokens
