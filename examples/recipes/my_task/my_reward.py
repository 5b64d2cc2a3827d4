"""The reward of examples/recipes/my_task: a function of your own, named in the config as
``my_reward:score`` (this file beside the config, or in the directory you run from).

``astraflow check`` imports it and scores the first task's reference answer before any role
starts; the rollout workers call it on every completion and the evaluator on every held-out
answer (a held-out answer counts as right when it scores more than 0.5).
"""

from __future__ import annotations


def score(completion: str, reference: dict, *, partial: float = 0.3) -> dict:
    """1 for the exact answer; otherwise ``partial`` times the share of the answer's digits
    that are right in their place (counted from the units), so a near miss earns a little
    and is never counted right. The extra keys are logged with the trajectory."""
    got, want = completion.strip(), str(reference["answer"])
    if got == want:
        return {"reward": 1.0, "exact": 1.0}
    places = sum(a == b for a, b in zip(reversed(got), reversed(want), strict=False))
    return {"reward": partial * places / max(len(got), len(want), 1), "exact": 0.0}
