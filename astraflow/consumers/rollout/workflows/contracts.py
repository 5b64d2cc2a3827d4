"""Reward contracts: which scalar each role of a multi-policy workflow gets, and from what.

A workflow that runs several roles registers a :class:`RewardContract`: one :class:`RoleReward`
per role, each naming a rule of :data:`RULES` that turns the episode's :class:`Outcome` into
that role's reward.

>>> register_contract(RewardContract("solver_verifier", {
...     "solver": RoleReward("final"), "verifier": RoleReward("verdict_correct")},
...     provides=frozenset({"verdict"})))

Config may override a role's rule through the workflow's ``rewards`` kwarg
(:func:`resolve_contract` validates it). :class:`ContractCheck` warns when a role's reward
cannot vary within a group, so it gets no gradient (docs/rollout.md, "Reward contracts").
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from astraflow.consumers.rollout.context import WorkflowError

log = logging.getLogger("astraflow.rollout.contract")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an episode produced, as the rules see it. Written by the workflow."""

    final: float  # reward of the answer that counts (after the verdict's retry / the pick)
    threshold: float = 0.5  # a reward >= threshold counts as a correct answer
    judged: float | None = None  # reward of the answer the verifier judged; None: no verifier
    verdict: bool | None = None  # True approve, False reject; None: unclear or no verifier
    candidates: tuple[float, ...] = ()  # reward of each candidate (solver_selector)
    picked: int | None = None  # index into candidates; None: unclear pick or no selector
    # how often judged answers are right lately (this worker's running rate, before this
    # episode); None: not tracked. verdict_balanced weighs each class by it.
    right_rate: float | None = None
    # reward of the verifier's own answer (the line before the verdict of one that shows its work,
    # scored like the solver's); None: it wrote one line only, or no verifier
    work: float | None = None

    def correct(self, reward: float) -> bool:
        return reward >= self.threshold


class RunningRate:
    """An exponentially weighted rate of a yes/no event (per process: each rollout worker
    tracks the answers its verifiers judge). ``update`` returns the rate before the event."""

    def __init__(self, halflife: float = 200.0, start: float = 0.5) -> None:
        self.alpha = 1.0 - 0.5 ** (1.0 / halflife)
        self.rate = start

    def update(self, event: bool) -> float:
        before = self.rate
        self.rate += self.alpha * (float(event) - self.rate)
        return before


RIGHT_RATE = RunningRate()  # the judged answers' right rate, for verdict_balanced


@dataclass(frozen=True, slots=True)
class Rule:
    """A role's reward as a function of the outcome (and the role's ``value``)."""

    fn: Callable[[Outcome, float], float]
    doc: str
    outcome_dependent: bool = True  # False: same reward whatever happened (the check warns)
    needs: frozenset[str] = frozenset()  # Outcome facts the workflow must provide


def _verdict_correct(o: Outcome, _: float) -> float:
    if o.verdict is None or o.judged is None:
        return 0.0  # an unclear verdict is never right
    return float(o.verdict == o.correct(o.judged))


def _verdict_balanced(o: Outcome, _: float) -> float:
    if o.verdict is None or o.judged is None:
        return 0.0
    right = o.correct(o.judged)
    if o.verdict != right:
        return 0.0
    rate = 0.5 if o.right_rate is None else min(0.95, max(0.05, o.right_rate))
    return 0.5 / (rate if right else 1.0 - rate)


def _work(o: Outcome, _: float) -> float:
    return 0.0 if o.work is None else o.work  # a verifier that showed no work earns nothing


def _verdict_and_work(o: Outcome, _: float) -> float:
    return (_verdict_balanced(o, _) + _work(o, _)) / 2


def _picked(o: Outcome, _: float) -> float:
    return 0.0 if o.picked is None else o.candidates[o.picked]


def _picked_correct(o: Outcome, _: float) -> float:
    return float(o.picked is not None and o.correct(o.candidates[o.picked]))


RULES: dict[str, Rule] = {
    "final": Rule(lambda o, _: o.final, "reward of the answer that counts"),
    "first": Rule(lambda o, _: o.final if o.judged is None else o.judged,
                  "reward of the first answer (the one the verifier judged)"),
    "first_and_final": Rule(
        lambda o, _: o.final if o.judged is None else (o.judged + o.final) / 2,
        "mean of the first answer's reward and the final answer's: a solver whose retry "
        "counts still learns to answer right the first time (with `final` alone, a verifier "
        "that rejects everything makes the first answer's reward irrelevant)"),
    "verdict_correct": Rule(_verdict_correct, "1 if the verdict (approve/reject) matched the "
                            "reference-based correctness of the judged answer, else 0",
                            needs=frozenset({"verdict"})),
    "verdict_balanced": Rule(
        _verdict_balanced, "a right verdict earns 0.5 / (how often the judged answers are "
        "of its class lately: right or wrong, the worker's running rate, clamped to "
        "[0.05, 0.95]); a wrong or unclear one 0. Its expectation is the verifier's balanced "
        "accuracy, so approving or rejecting everything earns 0.5 however good the solver is "
        "(with verdict_correct, a verifier of a solver that is mostly wrong learns to reject "
        "everything)", needs=frozenset({"verdict"})),
    "verdict_and_work": Rule(
        _verdict_and_work, "mean of verdict_balanced and the reward of the verifier's own "
        "answer (the line before its verdict, scored as the solver's answer is): a process "
        "reward for a verifier that computes before it judges, so its work is trained on the "
        "reference and cannot drift to copying the claim", needs=frozenset({"verdict", "work"})),
    "work": Rule(
        _work, "the reward of the verifier's own "
        "work alone (its line before the verdict, or with a tool its check: the tool's "
        "answer, scored as the solver's answer is); with `tool_verdict` the verdict follows "
        "from the check, so this is the whole of what the verifier decides",
        needs=frozenset({"work"})),
    "picked": Rule(_picked, "reward of the picked candidate (0 for an unclear pick)",
                   needs=frozenset({"picked"})),
    "picked_correct": Rule(_picked_correct, "1 if the picked candidate is correct, else 0 "
                           "(always 0 in a group where no candidate was correct)",
                           needs=frozenset({"picked"})),
    "constant": Rule(lambda o, v: v, "the role's `value`, whatever happened",
                     outcome_dependent=False),
}


@dataclass(frozen=True, slots=True)
class RoleReward:
    """One role's clause: a rule name from :data:`RULES` and its ``value`` (``constant``)."""

    rule: str
    value: float = 0.0

    def __str__(self) -> str:
        return f"{self.rule}:{self.value:g}" if self.rule == "constant" else self.rule


@dataclass(frozen=True)
class RewardContract:
    """The reward of every role of one workflow. ``provides``: the :class:`Outcome` facts the
    workflow fills in (``verdict``, ``picked``), so a rule needing another is refused."""

    workflow: str
    roles: Mapping[str, RoleReward]
    provides: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for role, clause in self.roles.items():
            _check_rule(self, role, clause, f"the {self.workflow} contract's role {role!r}")

    def reward(self, role: str, outcome: Outcome) -> float:
        clause = self.roles[role]
        return float(RULES[clause.rule].fn(outcome, clause.value))

    def describe(self) -> str:
        return ", ".join(f"{r}={c}" for r, c in self.roles.items())


def _check_rule(contract: RewardContract, role: str, clause: RoleReward, where: str) -> None:
    rule = RULES.get(clause.rule)
    if rule is None:
        raise WorkflowError(f"unknown reward rule {clause.rule!r} in {where}; valid: "
                            f"{', '.join(sorted(RULES))}")
    missing = rule.needs - contract.provides
    if missing:
        raise WorkflowError(f"reward rule {clause.rule!r} in {where} needs "
                            f"{', '.join(sorted(missing))}, which workflow {contract.workflow!r} "
                            f"does not provide; valid rules here: "
                            f"{', '.join(sorted(n for n, r in RULES.items() if r.needs <= contract.provides))}")


CONTRACTS: dict[str, RewardContract] = {}


def register_contract(contract: RewardContract) -> RewardContract:
    """Declare the default contract of ``contract.workflow`` (a user's workflow may too)."""
    CONTRACTS[contract.workflow] = contract
    return contract


def _clause(raw: Any, where: str) -> RoleReward:
    if isinstance(raw, RoleReward):
        return raw
    if isinstance(raw, str):
        rule, _, value = raw.partition(":")
        try:
            return RoleReward(rule.strip(), float(value) if value else 0.0)
        except ValueError:
            raise WorkflowError(f"bad reward clause {raw!r} in {where}: expected 'rule' or "
                                "'constant:VALUE'") from None
    if isinstance(raw, Mapping) and "rule" in raw and set(raw) <= {"rule", "value"}:
        return RoleReward(str(raw["rule"]), float(raw.get("value", 0.0)))
    raise WorkflowError(f"bad reward clause {raw!r} in {where}: expected 'rule', "
                        "'constant:VALUE' or {rule: ..., value: ...}")


def resolve_contract(workflow: str, overrides: Mapping[str, Any] | None = None) -> RewardContract:
    """The registered contract of ``workflow`` with ``overrides`` (the workflow's ``rewards``
    kwarg: role -> clause) applied; every bad role or rule is reported with its config path."""
    base = CONTRACTS.get(workflow)
    if base is None:
        raise WorkflowError(f"workflow {workflow!r} has no registered reward contract; "
                            f"registered: {', '.join(sorted(CONTRACTS)) or '(none)'}")
    if not overrides:
        return base
    where = f"rollout.workflow.kwargs.{workflow}.rewards"
    if not isinstance(overrides, Mapping):
        raise WorkflowError(f"{where} must map role -> rule, got {overrides!r}")
    roles = dict(base.roles)
    errors = []
    for role, raw in overrides.items():
        if role not in roles:
            errors.append(f"{where}.{role}: workflow {workflow!r} has no role {role!r}; roles: "
                          f"{', '.join(base.roles)}")
            continue
        try:
            roles[role] = clause = _clause(raw, f"{where}.{role}")
            _check_rule(base, role, clause, f"{where}.{role}")
        except WorkflowError as e:
            errors.append(str(e))
    if errors:
        raise WorkflowError("; ".join(errors))
    return RewardContract(workflow, roles, base.provides)


class ContractCheck:
    """Warns when a role's reward cannot vary within a group (see the module docstring).
    State is per process; :meth:`reset` forgets it (tests)."""

    MAX_PENDING = 4096  # groups being collected (an abandoned group must not leak memory)

    def __init__(self, window: int = 8) -> None:
        self.window = window
        self.reset()

    def reset(self) -> None:
        self.warned: set[tuple[str, str]] = set()
        self._declared: set[tuple[str, str, str]] = set()
        self._pending: OrderedDict[tuple[str, str, str], dict[int, float]] = OrderedDict()
        self._flat: dict[tuple[str, str], int] = {}

    def declare(self, contract: RewardContract) -> None:
        """Warn once per role whose rule does not depend on the outcome."""
        for role, clause in contract.roles.items():
            key = (contract.workflow, role, str(clause))
            if (contract.workflow, role) in self.warned or key in self._declared:
                continue
            self._declared.add(key)
            if not RULES[clause.rule].outcome_dependent:
                self._warn(contract.workflow, role,
                           f"rule={clause} does not depend on the episode's outcome")

    def observe(self, workflow: str, role: str, group: str, size: int, index: int,
                reward: float) -> None:
        """Record one member's reward; judge the group when all ``size`` members are in."""
        if size < 2 or (workflow, role) in self.warned:
            return
        key = (workflow, role, group)
        members = self._pending.setdefault(key, {})
        members[index] = reward
        if len(members) < size:
            if len(self._pending) > self.MAX_PENDING:
                self._pending.popitem(last=False)
            return
        del self._pending[key]
        flat = max(members.values()) == min(members.values())
        n = self._flat[(workflow, role)] = self._flat.get((workflow, role), 0) + 1 if flat else 0
        if n >= self.window:
            self._warn(workflow, role, f"observed zero reward variance in the last {n} groups "
                                       f"(reward={reward:g})")

    def _warn(self, workflow: str, role: str, why: str) -> None:
        self.warned.add((workflow, role))
        log.warning("degenerate reward contract workflow=%s role=%s: %s; every member of a "
                    "group gets the same reward, so its group-normalised advantage is 0 and the "
                    "role learns nothing (set rollout.workflow.kwargs.%s.rewards.%s)",
                    workflow, role, why, workflow, role)


CHECK = ContractCheck()
