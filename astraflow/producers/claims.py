"""Claims for a verifier: a problem with a proposed answer, right or wrong, half of each.

A claim is a :class:`TaskSpec` whose prompt is the verifier's prompt (``prompt``, formatted with
``{problem}``: the problem's text, ``{answer}``: the proposed answer, as the ``solver_verifier``
workflow formats it) and whose reference holds the verdict to give (``answer``: ``approve`` or
``reject`` words) and ``correct`` ("1"/"0"). The SFT warm-up of a verifier trains on them
(:func:`astraflow.producers.demos.demo_batches` with the verdict as the answer); the verifier's
evaluator measures its judgement on the test split's claims, balanced over right and wrong.

Wrong answers look like a tiny solver's mistakes: half change one digit of the right answer,
half are off by 1 to 9; never negative, never the right answer. Deterministic in ``seed``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from astraflow.core.records import ChatMessage
from astraflow.producers.sources import TaskSpec

DEFAULT_PROMPT = "{problem}{answer}?"


def problem_of(spec: TaskSpec) -> str:
    """The problem's text as another role sees it (system messages left out), as
    :func:`astraflow.consumers.rollout.workflows.roles.problem_text` gives a task's."""
    return "\n".join(m.content for m in spec.prompt if m.role != "system")


def wrong_answer(right: str, rng: random.Random) -> str:
    """A plausible wrong answer to a problem whose answer is the integer ``right``."""
    value = int(right)
    while True:
        if rng.random() < 0.5:
            i = rng.randrange(len(right))
            digit = rng.choice([d for d in "0123456789" if d != right[i]])
            text = right[:i] + digit + right[i + 1:]
            if len(text) > 1 and text[0] == "0":
                continue
        else:
            text = str(value + rng.choice([-1, 1]) * rng.randint(1, 9))
        if text != right and not text.startswith("-"):
            return text


def claim_specs(specs: Iterable[TaskSpec], *, prompt: str = DEFAULT_PROMPT, seed: int = 0,
                approve: str = "yes", reject: str = "no",
                show_work: bool = True) -> Iterator[TaskSpec]:
    """Two claims per problem (its right answer, then a wrong one), each a TaskSpec whose
    reference ``answer`` is the text to give: with ``show_work`` the verifier's own answer,
    a newline, then the verdict ("46\nno"), else the verdict alone. Showing the work is what
    lets a tiny model judge: it cannot add in the one forward pass a bare verdict gets, but it
    can write the sum digit by digit (as a solver does) and then compare."""
    rng = random.Random(seed)
    for spec in specs:
        problem = problem_of(spec)
        right = str(spec.reference["answer"])
        for answer, correct in ((right, True), (wrong_answer(right, rng), False)):
            yield TaskSpec(
                id=f"{spec.id}?{answer}",
                prompt=[ChatMessage(role="user",
                                    content=prompt.format(problem=problem, answer=answer))],
                reference={"answer": (f"{right}\n" if show_work else "")
                           + (approve if correct else reject),
                           "correct": "1" if correct else "0", "claimed": answer},
                metadata={**spec.metadata, "claim": "right" if correct else "wrong"})
