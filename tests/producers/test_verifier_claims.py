"""The verifier's claims (astraflow.producers.claims): right then wrong, half each, and the
work a right verifier writes before its verdict in each format; the solver's retry
demonstrations carry the same work."""

from __future__ import annotations

import random

import pytest

from astraflow.core.records import ChatMessage, unpack
from astraflow.producers.claims import WORK_FORMATS, claim_specs, columns, work_text, wrong_answer
from astraflow.producers.sources import TaskSpec


def spec(a: int, b: int) -> TaskSpec:
    return TaskSpec(id=f"p{a}-{b}", prompt=[ChatMessage(role="user", content=f"{a}+{b}=")],
                    reference={"answer": str(a + b)})


@pytest.mark.parametrize(("problem", "lines"), [
    ("12+39=", ["2+9=11", "1+3+1=5"]),
    ("5+7=", ["5+7=12"]),
    ("99+99=", ["9+9=18", "9+9+1=19"]),
    ("100+5=", ["0+5=5", "0+0+0=0", "1+0+0=1"]),
    ("0+0=", ["0+0=0"]),
])
def test_columns_are_the_column_sums_units_first_with_the_carry(problem: str,
                                                                 lines: list[str]) -> None:
    assert columns(problem) == lines


def test_column_sums_rebuild_the_sum_for_every_pair() -> None:
    for a in range(0, 120, 7):
        for b in range(0, 120, 11):
            digits, carry = "", 0
            for line in columns(f"{a}+{b}="):
                total = int(line.split("=")[1])
                digits, carry = str(total % 10) + digits, total // 10
            assert int((str(carry) if carry else "") + digits) == a + b


@pytest.mark.parametrize("problem", ["12-3=", "4*5=", "x+1=", "-2+3="])
def test_columns_refuse_anything_but_an_addition(problem: str) -> None:
    with pytest.raises(ValueError, match="columns work needs an addition"):
        columns(problem)


def test_each_work_format_ends_in_the_verifiers_own_answer() -> None:
    assert work_text("12+39=", "51", "sum") == "51\n"
    assert work_text("12+39=", "51", "columns") == "2+9=11\n1+3+1=5\n51\n"
    assert work_text("12+39=", "51", "none") == ""
    with pytest.raises(ValueError, match="valid: sum, columns, none"):
        work_text("12+39=", "51", "essay")
    assert WORK_FORMATS == ("sum", "columns", "none")


@pytest.mark.parametrize("work", WORK_FORMATS)
def test_claims_pair_a_right_and_a_wrong_answer_with_the_verdict_after_the_work(
        work: str) -> None:
    claims = list(claim_specs([spec(12, 39), spec(40, 8)], work=work, seed=3))
    assert [c.reference["correct"] for c in claims] == ["1", "0", "1", "0"]
    for c in claims:
        lines = c.reference["answer"].split("\n")
        assert lines[-1] == ("yes" if c.reference["correct"] == "1" else "no")
        if work != "none":  # the line before the verdict is the right answer, whatever claimed
            assert lines[-2] == str(sum(int(x) for x in c.id.split("?")[0][1:].split("-")))
        assert c.prompt[0].content == f"{c.id.split('?')[0][1:].replace('-', '+')}=" \
                                      f"{c.reference['claimed']}?"
    assert claims[1].reference["claimed"] != "51"


def test_wrong_answers_are_never_right_or_negative() -> None:
    rng = random.Random(0)
    for right in ("0", "7", "10", "51", "198"):
        for _ in range(200):
            w = wrong_answer(right, rng)
            assert w != right and not w.startswith("-") and (len(w) == 1 or w[0] != "0")


def test_the_solvers_retry_demonstrations_carry_the_configured_work() -> None:
    from pathlib import Path

    from astraflow.config import load_experiment
    from astraflow.models.tiny import build_tokenizer
    from astraflow.run.launch import retry_demonstrations

    root = Path(__file__).resolve().parents[2]
    tok = build_tokenizer("team")
    # the example's retry prompt: the verifier's text and the problem again; the columns one:
    # the verifier's text alone
    for example, feedback in (("solver_verifier.yaml", "46\nno\n14+32="),
                              ("solver_verifier_columns.yaml", "4+2=6\n1+3+0=4\n46\nno\n")):
        cfg = load_experiment(root / "examples" / example)
        (demo,) = retry_demonstrations(cfg, tok, [spec(14, 32)])
        ids, mask = unpack(demo.token_ids, "<i4").tolist(), unpack(demo.loss_mask, "u1").tolist()
        text = tok.decode(ids, skip_special_tokens=True)
        # the first (wrong) answer, the feedback, then the answer
        assert text.startswith("14+32=") and text.endswith(f"{feedback}46")
        taught = [t for t, m in zip(ids, mask, strict=True) if m]
        assert tok.decode(taught, skip_special_tokens=True) == "46"
