"""Claims for a verifier: a problem with a proposed answer, right or wrong, half of each.

A claim is a :class:`TaskSpec` whose prompt is the verifier's (``prompt`` formatted with
``{problem}`` and ``{answer}``, as the ``solver_verifier`` workflow formats it) and whose
reference holds the verdict to give (``answer``) and ``correct`` ("1"/"0"). The verifier's SFT
warm-up trains on them and its evaluator measures its judgement on them. Wrong answers look
like a tiny solver's mistakes; deterministic in ``seed``. ``work`` (:data:`WORK_FORMATS`:
``sum``, ``columns``, ``none``) is what the verifier writes before its verdict line
(docs/config.md, ``launch.warmup.verifier_work``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator

from astraflow.core.records import ChatMessage
from astraflow.producers.sources import TaskSpec

DEFAULT_PROMPT = "{problem}{answer}?"
WORK_FORMATS = ("sum", "columns", "none")
_ADDITION = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*")


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


def columns(problem: str) -> list[str]:
    """The column sums of the addition ``problem`` ("12+39="), units first, each with the carry
    into it after the first: ``["2+9=11", "1+3+1=5"]``. A ``ValueError`` for anything but the
    sum of two non-negative integers."""
    m = _ADDITION.fullmatch(problem)
    if m is None:
        raise ValueError(f"columns work needs an addition of two non-negative integers like "
                         f"'12+39=', not {problem!r}")
    a, b = m.group(1)[::-1], m.group(2)[::-1]
    lines, carry = [], None
    for i in range(max(len(a), len(b))):
        da, db = int(a[i]) if i < len(a) else 0, int(b[i]) if i < len(b) else 0
        total = da + db + (carry or 0)
        lines.append(f"{da}+{db}={total}" if carry is None else f"{da}+{db}+{carry}={total}")
        carry = total // 10
    return lines


def work_text(problem: str, right: str, work: str = "sum") -> str:
    """What a right verifier writes before its verdict line, newline included (see the module
    docstring): ``""`` for ``none``."""
    if work == "none":
        return ""
    if work == "sum":
        return f"{right}\n"
    if work == "columns":
        return "".join(f"{line}\n" for line in columns(problem)) + f"{right}\n"
    raise ValueError(f"unknown verifier work {work!r}; valid: {', '.join(WORK_FORMATS)}")


def claim_specs(specs: Iterable[TaskSpec], *, prompt: str = DEFAULT_PROMPT, seed: int = 0,
                approve: str = "yes", reject: str = "no",
                work: str = "sum") -> Iterator[TaskSpec]:
    """Two claims per problem (its right answer, then a wrong one), each a TaskSpec whose
    reference ``answer`` is the text to give: the verifier's ``work`` (:func:`work_text`),
    then the verdict ("46\nno"). Showing the work is what lets a tiny model judge: it cannot
    add in the one forward pass a bare verdict gets, but it can write the sum digit by digit
    (as a solver does), or column by column, and then compare."""
    rng = random.Random(seed)
    for spec in specs:
        problem = problem_of(spec)
        right = str(spec.reference["answer"])
        shown = work_text(problem, right, work)
        for answer, correct in ((right, True), (wrong_answer(right, rng), False)):
            yield TaskSpec(
                id=f"{spec.id}?{answer}",
                prompt=[ChatMessage(role="user",
                                    content=prompt.format(problem=problem, answer=answer))],
                reference={"answer": shown + (approve if correct else reject),
                           "correct": "1" if correct else "0", "claimed": answer},
                metadata={**spec.metadata, "claim": "right" if correct else "wrong"})
