"""Multi-policy workflows on scripted engines (one per policy): solver_verifier's approve and
reject → retry paths, solver_selector's pick, each role's reward per its contract, per-token
versions per policy, contract overrides and the degenerate-contract check."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from rollout_helpers import ScriptedEngine

from astraflow.consumers.rollout.context import Draft, EpisodeContext, WorkflowError
from astraflow.consumers.rollout.runtime import EpisodeOutcome, Runtime, run_episode
from astraflow.consumers.rollout.workflows.contracts import (
    CHECK,
    ContractCheck,
    RoleReward,
    resolve_contract,
)
from astraflow.consumers.rollout.workflows.solver_selector import parse_choice
from astraflow.consumers.rollout.workflows.solver_verifier import parse_verdict
from astraflow.core.records import ChatMessage, Task

LOGGER = "astraflow.rollout.contract"


@pytest.fixture(autouse=True)
def _fresh_check() -> Iterator[None]:
    CHECK.reset()  # warnings are once per process; each test starts from none
    yield
    CHECK.reset()


def task(workflow: str, *, answer: str = "5", n: int = 1, i: int = 0) -> Task:
    return Task(id=f"q{i}", dataset="t", prompt=[ChatMessage(role="user", content="2+3=")],
                reference={"answer": answer}, workflow=workflow, n_samples=n)


def runtime(tok: Any, scripts: Mapping[str, Sequence[str]], versions: Mapping[str, int],
            **kwargs: Any) -> tuple[Runtime, dict[str, ScriptedEngine]]:
    engines = {p: ScriptedEngine(tok, s, version=versions[p]) for p, s in scripts.items()}
    rt = Runtime.create(engines, reward="exact_match", sampling={"max_new_tokens": 200},
                        **kwargs)
    return rt, engines


def run(rt: Runtime, tasks: Sequence[tuple[Task, int]]) -> list[EpisodeOutcome]:
    """Run (task, sample_index) episodes one after the other (the scripts are in that order)."""
    async def go() -> list[EpisodeOutcome]:
        try:
            return [await run_episode(rt, t, i) for t, i in tasks]
        finally:
            await rt.close()

    return asyncio.run(go())


def generated(tok: Any, d: Draft) -> list[str]:
    """The text of each assistant turn of a draft."""
    return [tok.decode(d.token_ids[s.start:s.end], skip_special_tokens=True)
            for s in d.spans if s.role == "assistant"]


def masked_versions(d: Draft) -> set[int]:
    return {v for v, m in zip(d.versions, d.loss_mask, strict=True) if m}


def by_policy(out: EpisodeOutcome) -> dict[str, Draft]:
    assert out.error is None, out.error
    drafts = {d.policy: d for d in out.drafts}
    assert len(drafts) == len(out.drafts)  # one trajectory per policy
    return drafts


def test_parse_verdict_and_choice() -> None:
    assert parse_verdict("It checks out.\nVERDICT: approve") is True
    assert parse_verdict("verdict: **Reject**") is False
    assert parse_verdict("VERDICT: reject\nOn reflection, VERDICT: approve") is True
    assert parse_verdict("No.") is False and parse_verdict("yes") is True
    for unclear in ("the answer is not correct", "hmm", "", "VERDICT: maybe"):
        assert parse_verdict(unclear) is None
    assert parse_choice("2 looks right. CHOICE: 3", 3) == 2
    assert parse_choice(" 1 ", 3) == 0
    for unclear in ("CHOICE: 4", "CHOICE: 0", "the answer is 5", ""):
        assert parse_choice(unclear, 3) is None


def test_solver_verifier_approve(ascii_tokenizer) -> None:
    tok = ascii_tokenizer
    rt, engines = runtime(tok, {"solver": ["5"], "verifier": ["Checks out. VERDICT: approve"]},
                          {"solver": 3, "verifier": 7})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    d = by_policy(out)
    assert generated(tok, d["solver"]) == ["5"]  # no retry
    assert (d["solver"].reward, d["verifier"].reward) == (1.0, 1.0)
    assert d["solver"].rewards["retried"] == 0.0 and d["verifier"].rewards["approved"] == 1.0
    assert masked_versions(d["solver"]) == {3} and masked_versions(d["verifier"]) == {7}
    # the verifier saw the problem and the solver's answer
    seen = tok.decode(engines["verifier"].calls[0].prompt_ids)
    assert "2+3=" in seen and "Proposed answer:\n5" in seen
    assert len(engines["solver"].calls) == 1


def test_solver_verifier_reject_then_retry(ascii_tokenizer) -> None:
    tok = ascii_tokenizer
    verdict = "2+3 is not 6. VERDICT: reject"
    rt, engines = runtime(tok, {"solver": ["6", "5"], "verifier": [verdict]},
                          {"solver": 2, "verifier": 9})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    d = by_policy(out)
    solver = d["solver"]
    assert generated(tok, solver) == ["6", "5"]  # both turns in one trajectory
    # the retry was generated with the verdict in its context, and the trajectory keeps it
    assert verdict in tok.decode(engines["solver"].calls[1].prompt_ids)
    between = [s for s in solver.spans if s.role == "user"][-1]
    assert verdict in tok.decode(solver.token_ids[between.start:between.end])
    assert set(solver.loss_mask[between.start:between.end]) == {0}
    # contract: the solver gets its final (retried) answer's reward; the verifier was right to
    # reject the wrong first answer
    assert solver.reward == 1.0 and solver.rewards["first_answer"] == 0.0
    assert solver.rewards["retried"] == 1.0
    assert d["verifier"].reward == 1.0 and d["verifier"].rewards["approved"] == 0.0
    assert masked_versions(solver) == {2} and masked_versions(d["verifier"]) == {9}
    assert out.ctx.counters == {"verifier_retries": 1.0}


@pytest.mark.parametrize(("answer", "verdict", "solver_reward", "verifier_reward"), [
    ("6", "VERDICT: approve", 0.0, 0.0),  # approved a wrong answer: no retry, verifier wrong
    ("5", "VERDICT: reject", 1.0, 0.0),  # rejected a right answer: retry, verifier wrong
    ("5", "I am not sure", 1.0, 0.0),  # unclear: no retry, never right
])
def test_solver_verifier_contract_rewards(ascii_tokenizer, answer: str, verdict: str,
                                          solver_reward: float, verifier_reward: float) -> None:
    rt, engines = runtime(ascii_tokenizer, {"solver": [answer, "5"], "verifier": [verdict]},
                          {"solver": 0, "verifier": 0})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    d = by_policy(out)
    assert (d["solver"].reward, d["verifier"].reward) == (solver_reward, verifier_reward)
    retried = parse_verdict(verdict) is False
    assert len(engines["solver"].calls) == (2 if retried else 1)
    if parse_verdict(verdict) is None:
        assert out.ctx.counters == {"verdict_unclear": 1.0}


def test_retry_can_be_switched_off_and_policies_mapped(ascii_tokenizer) -> None:
    rt, engines = runtime(ascii_tokenizer, {"actor": ["6", "5"], "judge": ["VERDICT: reject"]},
                          {"actor": 1, "judge": 4}, workflow_kwargs={"solver_verifier": {
                              "retry": False,
                              "policies": {"solver": "actor", "verifier": "judge"}}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    d = by_policy(out)
    assert set(d) == {"actor", "judge"}
    assert len(engines["actor"].calls) == 1 and d["actor"].reward == 0.0
    assert d["judge"].reward == 1.0


def test_solver_selector_pick(ascii_tokenizer) -> None:
    tok = ascii_tokenizer
    rt, engines = runtime(tok, {"solver": ["4", "5", "6"], "selector": ["CHOICE: 2"]},
                          {"solver": 5, "selector": 8},
                          workflow_kwargs={"solver_selector": {"k": 3}})
    (out,) = run(rt, [(task("solver_selector"), 0)])
    d = by_policy(out)
    assert len(engines["solver"].calls) == 3
    seen = tok.decode(engines["selector"].calls[0].prompt_ids)
    assert "1. 4\n2. 5\n3. 6" in seen and "2+3=" in seen
    assert generated(tok, d["solver"]) == ["5"]  # the picked candidate's trajectory
    assert (d["solver"].reward, d["selector"].reward) == (1.0, 1.0)
    assert d["selector"].rewards["picked"] == 2.0 and d["selector"].rewards["best"] == 1.0
    assert masked_versions(d["solver"]) == {5} and masked_versions(d["selector"]) == {8}


def test_solver_selector_wrong_and_unclear_picks(ascii_tokenizer) -> None:
    tok = ascii_tokenizer
    rt, _ = runtime(tok, {"solver": ["4", "5", "6", "5", "4"], "selector": ["CHOICE: 1", "??"]},
                    {"solver": 0, "selector": 0},
                    workflow_kwargs={"solver_selector": {"k": 2}})
    wrong, unclear = run(rt, [(task("solver_selector"), 0), (task("solver_selector"), 1)])
    d = by_policy(wrong)
    assert generated(tok, d["solver"]) == ["4"] and d["selector"].reward == 0.0
    d = by_policy(unclear)
    # unclear: the system answer falls back to candidate 1 ("6"), the selector gets 0
    assert generated(tok, d["solver"]) == ["6"] and d["solver"].reward == 0.0
    assert d["selector"].reward == 0.0 and d["selector"].rewards["picked"] == 0.0
    assert unclear.ctx.counters == {"choice_unclear": 1.0}


def test_contract_override_from_workflow_kwargs(ascii_tokenizer) -> None:
    rt, _ = runtime(ascii_tokenizer, {"solver": ["6"], "verifier": ["VERDICT: reject"]},
                    {"solver": 0, "verifier": 0}, workflow_kwargs={"solver_verifier": {
                        "retry": False, "rewards": {"verifier": "constant:0.25"}}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    assert by_policy(out)["verifier"].reward == 0.25
    contract = resolve_contract("solver_verifier", {"verifier": {"rule": "constant",
                                                                 "value": 0.5}})
    assert contract.roles["verifier"] == RoleReward("constant", 0.5)
    assert contract.roles["solver"] == RoleReward("final")


@pytest.mark.parametrize(("workflow", "overrides", "message"), [
    ("solver_verifier", {"judge": "final"},
     "rollout.workflow.kwargs.solver_verifier.rewards.judge: workflow 'solver_verifier' has "
     "no role 'judge'; roles: solver, verifier"),
    ("solver_verifier", {"verifier": "vibes"}, "unknown reward rule 'vibes'"),
    ("solver_verifier", {"verifier": "picked"}, "needs picked"),
    ("solver_selector", {"selector": "verdict_correct"}, "needs verdict"),
    ("solver_verifier", {"verifier": "constant:lots"}, "expected 'rule' or 'constant:VALUE'"),
    ("nope", {}, "workflow 'nope' has no registered reward contract"),
])
def test_bad_contract_overrides_are_refused(workflow: str, overrides: dict, message: str) -> None:
    with pytest.raises(WorkflowError) as e:
        resolve_contract(workflow, overrides or None)
    assert message in str(e.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"policies": {"verifier": "judge"}},
     "workflow 'solver_verifier' role 'verifier' uses policy 'judge', which has no engine in "
     "this worker; hosted: solver, verifier"),
    ({"policies": {"critic": "solver"}}, "has no role 'critic'"),
])
def test_unknown_policy_or_role_is_a_clear_error(ascii_tokenizer, kwargs: dict,
                                                 message: str) -> None:
    rt, _ = runtime(ascii_tokenizer, {"solver": ["5"], "verifier": ["yes"]},
                    {"solver": 0, "verifier": 0}, workflow_kwargs={"solver_verifier": kwargs})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    assert out.error is not None and message in out.error
    assert [d.finish_reason for d in out.drafts] == ["error"]


def test_missing_policy_engine_is_a_clear_error(ascii_tokenizer) -> None:
    rt, _ = runtime(ascii_tokenizer, {"solver": ["5"]}, {"solver": 0})
    (out,) = run(rt, [(task("solver_selector"), 0)])
    assert "role 'selector' uses policy 'selector', which has no engine" in (out.error or "")


def test_constant_contract_warns_once(ascii_tokenizer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    rt, _ = runtime(ascii_tokenizer, {"solver": ["5", "6"], "verifier": ["yes", "yes"]},
                    {"solver": 0, "verifier": 0}, workflow_kwargs={"solver_verifier": {
                        "rewards": {"verifier": "constant:0.5"}}})
    run(rt, [(task("solver_verifier", n=2), 0), (task("solver_verifier", n=2), 1)])
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, warnings
    assert "workflow=solver_verifier role=verifier" in warnings[0]
    assert "rule=constant:0.5 does not depend on the episode's outcome" in warnings[0]


def test_sound_contract_does_not_warn(ascii_tokenizer, caplog) -> None:
    """Default contract, groups whose answers differ: no warning, even after many groups."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    groups = 10
    solver, verifier, episodes = [], [], []
    for g in range(groups):
        solver += ["5", "6"]  # one right, one wrong per group of 2
        verifier += ["VERDICT: approve", "VERDICT: approve"]
        episodes += [(task("solver_verifier", n=2, i=g), 0), (task("solver_verifier", n=2, i=g), 1)]
    rt, _ = runtime(ascii_tokenizer, {"solver": solver, "verifier": verifier},
                    {"solver": 0, "verifier": 0})
    outs = run(rt, episodes)
    assert all(o.error is None for o in outs)
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == []


def test_observed_flat_groups_warn_after_the_window(caplog) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    check = ContractCheck(window=3)
    # a varied group, then flat ones: the warning comes with the third flat group in a row
    for i, r in enumerate([1.0, 0.0]):
        check.observe("wf", "verifier", "g0", 2, i, r)
    for g in range(1, 3):
        for i in range(2):
            check.observe("wf", "verifier", f"g{g}", 2, i, 0.5)
    assert not caplog.records
    check.observe("wf", "verifier", "g3", 2, 0, 0.5)
    assert not caplog.records  # the group is not complete yet
    check.observe("wf", "verifier", "g3", 2, 1, 0.5)
    (rec,) = caplog.records
    assert "observed zero reward variance in the last 3 groups" in rec.getMessage()
    for g in range(4, 10):  # once per workflow/role
        for i in range(2):
            check.observe("wf", "verifier", f"g{g}", 2, i, 0.5)
    assert len(caplog.records) == 1


def test_a_varied_group_resets_the_flat_count(caplog) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    check = ContractCheck(window=2)
    for g, rewards in enumerate([(1.0, 1.0), (0.0, 1.0), (0.0, 0.0), (1.0, 0.0), (1.0, 1.0)]):
        for i, r in enumerate(rewards):
            check.observe("wf", "solver", f"g{g}", 2, i, r)
    for i in range(3):  # groups of one sample never count: no variance to have
        check.observe("wf", "solver", f"single{i}", 1, 0, 1.0)
    assert not caplog.records


def test_a_retry_demonstration_is_laid_out_as_the_workflow_lays_out_a_retry() -> None:
    # the team solver's SFT retry demos must be token for token what the workflow gives it
    from astraflow.models.tiny import build_tokenizer
    from astraflow.producers.demos import retry_demonstration
    from astraflow.producers.sources import TaskSpec

    tok = build_tokenizer("team")
    kwargs = {"solver_verifier": {"verifier_prompt": "{problem}{answer}?",
                                  "retry_prompt": "{verdict}\n{problem}"}}
    rt, _ = runtime(tok, {"solver": ["6", "5"], "verifier": ["5\nno"]},
                    {"solver": 1, "verifier": 1}, workflow_kwargs=kwargs)
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    solver = by_policy(out)["solver"]
    spec = TaskSpec(id="q0", prompt=[ChatMessage(role="user", content="2+3=")],
                    reference={"answer": "5"})
    demo = retry_demonstration(tok, spec, first="6", feedback="5\nno\n2+3=")
    from astraflow.core.records import unpack

    assert unpack(demo.token_ids, "<i4").tolist() == solver.token_ids
    mask = unpack(demo.loss_mask, "u1").tolist()
    # only the retry is taught: the first answer and the feedback are context
    assert mask == [0] * (len(mask) - 2) + [1, 1] and solver.loss_mask[-2:] == [1, 1]


@pytest.mark.parametrize(("first", "verdict", "second", "reward"), [
    ("6", "VERDICT: reject", "5", 0.5),  # wrong, then right on the retry: half
    ("5", "VERDICT: approve", None, 1.0),  # right at once: all of it
    ("5", "VERDICT: reject", "6", 0.5),  # right, wrongly rejected, then wrong
    ("6", "VERDICT: reject", "7", 0.0),
])
def test_first_and_final_rewards_the_first_answer_too(ascii_tokenizer, first: str,
                                                      verdict: str, second: str | None,
                                                      reward: float) -> None:
    script = [first] if second is None else [first, second]
    rt, _ = runtime(ascii_tokenizer, {"solver": script, "verifier": [verdict]},
                    {"solver": 0, "verifier": 0},
                    workflow_kwargs={"solver_verifier": {"rewards": {
                        "solver": "first_and_final"}}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    assert by_policy(out)["solver"].reward == reward


def test_verdict_balanced_pays_the_balanced_accuracy_in_expectation() -> None:
    # a solver right 20% of the time: verdict_correct pays a reject-everything verifier 0.8,
    # more than a judging one with 70% on each class (0.7); verdict_balanced pays both their
    # balanced accuracy (0.5 and 0.7), so judging wins
    from astraflow.consumers.rollout.workflows.contracts import RULES, Outcome

    def expected(rule: str, p_right: float, tpr: float, tnr: float) -> float:
        fn = RULES[rule].fn
        cases = [(1.0, True, p_right * tpr), (1.0, False, p_right * (1 - tpr)),
                 (0.0, False, (1 - p_right) * tnr), (0.0, True, (1 - p_right) * (1 - tnr))]
        return sum(w * fn(Outcome(final=judged, judged=judged, verdict=v, right_rate=p_right),
                          0.0) for judged, v, w in cases)

    assert expected("verdict_correct", 0.2, 0.0, 1.0) > expected("verdict_correct", 0.2, .7, .7)
    for p in (0.1, 0.2, 0.5, 0.8):
        assert expected("verdict_balanced", p, 0.0, 1.0) == pytest.approx(0.5)
        assert expected("verdict_balanced", p, 1.0, 0.0) == pytest.approx(0.5)
        assert expected("verdict_balanced", p, 0.7, 0.7) == pytest.approx(0.7)
    assert RULES["verdict_balanced"].fn(Outcome(final=0.0, judged=0.0, verdict=None), 0) == 0


def test_the_running_right_rate_follows_the_judged_answers() -> None:
    from astraflow.consumers.rollout.workflows.contracts import RunningRate

    r = RunningRate(halflife=50)
    assert r.update(True) == 0.5  # the rate before the event
    for i in range(2000):
        r.update(i % 4 == 0)
    assert r.rate == pytest.approx(0.25, abs=0.05)


def test_train_retry_false_keeps_the_retry_as_context_only(ascii_tokenizer) -> None:
    rt, _ = runtime(ascii_tokenizer, {"solver": ["6", "5"], "verifier": ["VERDICT: reject"]},
                    {"solver": 3, "verifier": 1},
                    workflow_kwargs={"solver_verifier": {"train_retry": False, "rewards": {
                        "solver": "first"}}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    solver = by_policy(out)["solver"]
    assert generated(ascii_tokenizer, solver) == ["6", "5"]  # both answers are in it
    first = [s for s in solver.spans if s.role == "assistant"][0]
    trained = [i for i, m in enumerate(solver.loss_mask) if m]
    assert trained == list(range(first.start, first.end))  # only the first answer is trained
    assert solver.versions[-1] == -1 and solver.logprobs[-1] == 0.0
    assert solver.reward == 0.0 and solver.rewards["final_answer"] == 1.0  # rule `first`


def test_train_verifier_work_false_trains_the_verdict_line_only() -> None:
    from astraflow.models.tiny import build_tokenizer

    tok = build_tokenizer("team")
    rt, _ = runtime(tok, {"solver": ["6", "5"], "verifier": ["5\nno"]},
                    {"solver": 3, "verifier": 1},
                    workflow_kwargs={"solver_verifier": {
                        "train_verifier_work": False, "verifier_prompt": "{problem}{answer}?",
                        "retry_prompt": "{verdict}\n{problem}"}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    verifier = by_policy(out)["verifier"]
    trained = [verifier.token_ids[i] for i, m in enumerate(verifier.loss_mask) if m]
    assert tok.decode(trained) == "no<eos>"
    assert verifier.reward == 1.0  # the verdict is still parsed from the whole text


def test_verdict_and_work_rewards_the_verifiers_own_answer(ascii_tokenizer) -> None:
    # the verifier shows its work ("5", its own answer to 2+3=) before its verdict; the rule
    # pays half for the verdict (balanced) and half for the work being right
    from astraflow.consumers.rollout.workflows.contracts import RULES, Outcome

    fn = RULES["verdict_and_work"].fn
    wrong_claim = Outcome(final=0.0, judged=0.0, verdict=False, right_rate=0.5, work=1.0)
    assert fn(wrong_claim, 0.0) == pytest.approx((1.0 + 1.0) / 2)
    assert fn(Outcome(final=0.0, judged=0.0, verdict=False, right_rate=0.5, work=0.0),
              0.0) == pytest.approx(0.5)
    assert fn(Outcome(final=0.0, judged=0.0, verdict=True, right_rate=0.5, work=None), 0) == 0
    paid = {}
    for work, expected_work in (("5", 1.0), ("7", 0.0)):
        rt, _ = runtime(ascii_tokenizer, {"solver": ["6", "5"], "verifier": [f"{work}\nno"]},
                        {"solver": 0, "verifier": 0}, workflow_kwargs={"solver_verifier": {
                            "rewards": {"verifier": "verdict_and_work"}}})
        (out,) = run(rt, [(task("solver_verifier"), 0)])
        d = by_policy(out)
        assert d["verifier"].rewards["work_answer"] == expected_work
        paid[work] = d["verifier"].reward
    # both rejected the wrong "6" (a right verdict, paid the same); the right work earns more
    # (the running right rate moves a little between the two episodes)
    assert paid["7"] > 0 and paid["5"] == pytest.approx(paid["7"] + 0.5, abs=0.01)
    # a one-line verifier has no work: the component says so (-1) and the rule pays it 0
    rt, _ = runtime(ascii_tokenizer, {"solver": ["6", "5"], "verifier": ["no"]},
                    {"solver": 0, "verifier": 0})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    assert by_policy(out)["verifier"].rewards["work_answer"] == -1.0


def test_the_work_answer_is_the_line_before_the_verdict(ascii_tokenizer) -> None:
    # a verifier that writes column sums first ("3+2=5", its own answer "5", then "no"): the
    # line before the verdict is its answer, scored as the solver's is; the retry sees it all
    for work, expected in (("3+2=5\n5\nno", 1.0), ("3+2=5\n6\nno", 0.0),
                           ("3+2=5\n0+0+0=0\n5\nno", 1.0)):
        rt, _ = runtime(ascii_tokenizer, {"solver": ["6", "5"], "verifier": [work]},
                        {"solver": 0, "verifier": 0}, workflow_kwargs={"solver_verifier": {
                            "rewards": {"verifier": "verdict_and_work"},
                            "retry_prompt": "{verdict}\n{problem}"}})
        (out,) = run(rt, [(task("solver_verifier"), 0)])
        d = by_policy(out)
        assert d["verifier"].rewards["work_answer"] == expected
        assert generated(ascii_tokenizer, d["solver"]) == ["6", "5"]
        feedback = ascii_tokenizer.decode(d["solver"].token_ids, skip_special_tokens=True)
        assert f"{work}\n2+3=" in feedback


def test_turn_rewards_score_the_first_answer_and_the_retry_apart(ascii_tokenizer) -> None:
    kwargs = {"solver_verifier": {"turn_rewards": True, "rewards": {"solver": "first_and_final"}}}
    rt, _ = runtime(ascii_tokenizer, {"solver": ["6", "5", "5"],
                                      "verifier": ["VERDICT: reject", "VERDICT: approve"]},
                    {"solver": 3, "verifier": 1}, workflow_kwargs=kwargs)
    retried, approved = run(rt, [(task("solver_verifier"), 0), (task("solver_verifier"), 1)])
    solver = by_policy(retried)["solver"]
    # the wrong first answer is scored 0, the right retry 1; the scalar reward is the contract's
    assert solver.turn_rewards == [0.0, 1.0] and solver.reward == 0.5
    assert by_policy(approved)["solver"].turn_rewards == [1.0]  # one turn, one reward
    assert by_policy(retried)["verifier"].turn_rewards == []  # the verifier's turn is one
    # off by default
    rt, _ = runtime(ascii_tokenizer, {"solver": ["6", "5"], "verifier": ["VERDICT: reject"]},
                    {"solver": 3, "verifier": 1})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    assert by_policy(out)["solver"].turn_rewards == []


def test_a_retry_that_returned_no_tokens_has_no_turn_reward(ascii_tokenizer) -> None:
    """A generation with no tokens (the context full) makes no turn: the solver's turn rewards
    follow the turns it has, so its record still builds."""
    engines = {"solver": ScriptedEngine(ascii_tokenizer, ["6", ""], version=1, eos=False),
               "verifier": ScriptedEngine(ascii_tokenizer, ["VERDICT: reject"], version=1)}
    rt = Runtime.create(engines, reward="exact_match", sampling={"max_new_tokens": 200},
                        workflow_kwargs={"solver_verifier": {"turn_rewards": True}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    solver = by_policy(out)["solver"]
    assert generated(ascii_tokenizer, solver) == ["6"] and solver.turn_rewards == [0.0]
    assert solver.rewards["retried"] == 1.0


def test_a_turn_reward_count_that_misses_the_turns_is_a_workflow_error(ascii_tokenizer) -> None:
    rt, _ = runtime(ascii_tokenizer, {"solver": ["5"]}, {"solver": 0})

    async def go() -> None:
        ctx = EpisodeContext(rt, task("solver_verifier"), 0)
        conv = ctx.conversation(None, policy="solver")
        await conv.generate()
        with pytest.raises(WorkflowError, match="turn_rewards has 2 entries but the "
                                                "conversation has 1 assistant turns"):
            conv.finish(1.0, turn_rewards=[1.0, 0.0])
        assert conv.finish(1.0, turn_rewards=[1.0]).turn_rewards == [1.0]
        await rt.close()

    asyncio.run(go())


def test_first_expression_finds_the_computation_in_the_verifiers_text() -> None:
    from astraflow.consumers.rollout.workflows.solver_verifier import first_expression

    assert first_expression("To check, write the expression 8 - 0 = 8.") == "8 - 0"
    assert first_expression("(12 + 3) * 2 and then 1 + 1") == "(12 + 3) * 2"
    assert first_expression("-4+7") == "-4+7"
    assert first_expression("the answer is 5") is None and first_expression("") is None


@pytest.mark.parametrize(("first", "check", "verdict", "retried", "work"), [
    # a wrong answer, the check right, the verdict right: the retry sees the tool's result
    ("6", "I compute 2 + 3", "no", True, 1.0),
    # a right answer approved after a right check: no retry
    ("5", "2+3", "yes", False, 1.0),
    # a check with no arithmetic in it: the tool is not called, the work earns 0
    ("6", "no idea", "no", True, 0.0),
    # a check that computes the wrong thing: the tool answers it, the work earns 0
    ("6", "2 * 3", "yes", False, 0.0),
])
def test_a_verifier_checks_with_a_tool(ascii_tokenizer, first: str, check: str, verdict: str,
                                       retried: bool, work: float) -> None:
    tok = ascii_tokenizer
    solver = [first, "5"] if retried else [first]
    rt, engines = runtime(tok, {"solver": solver, "verifier": [check, verdict]},
                          {"solver": 2, "verifier": 5}, workflow_kwargs={"solver_verifier": {
                              "verifier_tool": "calculator", "check_max_new_tokens": 30,
                              "retry_prompt": "Rejected; the calculator says {check}. Again:",
                              "rewards": {"verifier": "verdict_and_work"}}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    d = by_policy(out)
    v = d["verifier"]
    assert generated(tok, v) == [check, verdict]  # the check and the verdict, one trajectory
    asked = tok.decode(engines["verifier"].calls[1].prompt_ids)  # what the verdict turn saw
    computed = {"I compute 2 + 3": "2 + 3 = 5", "2+3": "2+3 = 5", "2 * 3": "2 * 3 = 6",
                "no idea": "? = nothing (no arithmetic expression was written)"}[check]
    assert f"The calculator computed {computed}" in asked
    assert f"The proposed answer is {first}." in asked
    assert engines["verifier"].calls[0].max_new_tokens == 30  # the check turn's own budget
    assert engines["verifier"].calls[1].max_new_tokens == 200
    # both verifier turns are trained, the tool's message between them is context
    user = [s for s in v.spans if s.role == "user"][-1]
    assert set(v.loss_mask[user.start:user.end]) == {0}
    assert masked_versions(v) == {5}
    assert v.rewards["work_answer"] == work
    assert d["solver"].rewards["retried"] == float(retried)
    if retried:
        seen = tok.decode(engines["solver"].calls[1].prompt_ids)
        assert f"Rejected; the calculator says {computed}. Again:" in seen
        assert d["solver"].reward == 1.0
    assert out.ctx.counters.get("check_no_expression", 0) == (check == "no idea")


def test_an_unknown_check_tool_reaches_the_verifier_as_an_error(ascii_tokenizer) -> None:
    rt, engines = runtime(ascii_tokenizer, {"solver": ["6", "5"], "verifier": ["2+3", "no"]},
                          {"solver": 0, "verifier": 0}, workflow_kwargs={"solver_verifier": {
                              "verifier_tool": "abacus", "rewards": {
                                  "verifier": "verdict_and_work"}}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    v = by_policy(out)["verifier"]
    assert "unknown tool 'abacus'" in ascii_tokenizer.decode(engines["verifier"].calls[1].prompt_ids)
    assert v.rewards["work_answer"] == 0.0
    assert out.ctx.counters["tool_failures"] == 1.0


@pytest.mark.parametrize(("first", "check", "verdict", "work"), [
    ("6", "2 + 3", False, 1.0),  # the tool's 5 is not the claim 6: rejected, the retry told 5
    ("5", "so 2+3", True, 1.0),  # the claim is the tool's answer: approved
    ("5", "2 * 3", False, 0.0),  # a wrong check rejects a right claim
    ("6", "I cannot", None, 0.0),  # no check: no verdict, no retry
])
def test_a_tool_verdict_compares_the_claim_with_the_tools_answer(
        ascii_tokenizer, first: str, check: str, verdict: bool | None, work: float) -> None:
    tok = ascii_tokenizer
    solver = [f"It is {first}.", "5"] if verdict is False else [f"It is {first}."]
    rt, engines = runtime(tok, {"solver": solver, "verifier": [check]},
                          {"solver": 1, "verifier": 4}, workflow_kwargs={"solver_verifier": {
                              "verifier_tool": "calculator", "tool_verdict": True,
                              "answer_extract": "last_number",
                              "verifier_prompt": "{problem} claim {answer}; check:",
                              "retry_prompt": "No: {check}.",
                              "rewards": {"verifier": "work"}}})
    (out,) = run(rt, [(task("solver_verifier"), 0)])
    d = by_policy(out)
    assert d["verifier"].reward == work  # the `work` rule: its check alone, 0 without one
    # the verifier saw the extracted claim, wrote one turn (its check) and nothing more
    assert f"2+3= claim {first}; check:" in tok.decode(engines["verifier"].calls[0].prompt_ids)
    assert generated(tok, d["verifier"]) == [check] and len(engines["verifier"].calls) == 1
    assert d["verifier"].rewards["approved"] == (-1.0 if verdict is None else float(verdict))
    assert d["verifier"].rewards["work_answer"] == work
    if verdict is False:
        told = {"2 + 3": "2 + 3 = 5", "2 * 3": "2 * 3 = 6"}[check]
        assert f"No: {told}." in tok.decode(engines["solver"].calls[1].prompt_ids)
    assert len(engines["solver"].calls) == (2 if verdict is False else 1)
    assert out.ctx.counters.get("verdict_unclear", 0) == (verdict is None)


def test_same_number() -> None:
    from astraflow.consumers.rollout.workflows.solver_verifier import same_number

    assert same_number("8", "8.0") and same_number("-3", " -3 ")
    assert not same_number("8", "9") and not same_number("8", "eight")
    assert not same_number("", "")
