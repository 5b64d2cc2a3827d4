"""bench/sum_order.py: the two digit orders, the labels (the answer and <eos>, nothing of the
prompt), the held-out split, and a short run whose loss falls."""

from __future__ import annotations

from bench import sum_order


def test_the_orders_write_the_same_sum_in_opposite_directions() -> None:
    assert sum_order.target(12, 39, "msb") == "51"
    assert sum_order.target(12, 39, "lsb") == "15"
    assert sum_order.target(99, 99, "lsb") == "891"


def test_training_problems_never_include_a_held_out_one() -> None:
    test, stream = sum_order.split(0, n_test=50)
    held = set(test)
    assert len(test) == 50
    assert not any(next(stream) in held for _ in range(2000))


def test_only_the_answer_and_eos_are_labelled() -> None:
    from astraflow.models.tiny import build_tokenizer

    tok = build_tokenizer("team")
    ids, mask, labels = sum_order.batch(tok, [(12, 39), (5, 7)], "lsb")
    for row in range(2):
        answer = [t for t in labels[row].tolist() if t != -100]
        assert tok.decode(answer[:-1]) == ["15", "21"][row]
        assert answer[-1] == tok.eos_token_id
        # the labelled tokens are the last ones of the row, and the row's own ids
        n = len(answer)
        assert ids[row, -n:].tolist() == answer
        assert (labels[row, :-n] == -100).all()
    assert mask[1].tolist().count(0) == 2  # "5+7=" is two characters shorter than "12+39="


def test_a_short_run_learns_something() -> None:
    curve = sum_order.train("msb", steps=40, every=20, batch_size=64, lr=2e-3, seed=0)
    assert [p["step"] for p in curve] == [20, 40]
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in curve)
    assert curve[-1]["loss"] < 2.0  # from ~2.9 (uniform over 24 tokens: ln 24 = 3.2)


def test_the_columns_work_ends_in_the_sum() -> None:
    assert sum_order.target(12, 39, "columns") == "2+9=11\n1+3+1=5\n51"
    assert sum_order.target(3, 4, "columns") == "3+4=7\n7"
    for a, b in ((0, 0), (99, 99), (50, 50), (9, 91)):
        assert sum_order.answer_of(sum_order.target(a, b, "columns")) == str(a + b)
    assert sum_order.answer_of("") == ""
