"""The experiment config's cross-section checks: what no one section can check alone (a team's
roles against ``policies``, a warm-up setting against the producer, ...).

Each check is a pure function of the config returning its problems (never raising), and names
the top-level sections it reads: :func:`problems` runs every check whose sections validated,
so that one load reports the field errors and the cross-section errors together
(:meth:`astraflow.config.ExperimentConfig._every_problem`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

import pydantic
from pydantic_core import InitErrorDetails, PydanticCustomError

from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.core.errors import ConfigError

if TYPE_CHECKING:
    from astraflow.config.experiment import ExperimentConfig

Problems = list[InitErrorDetails]
Check = Callable[["ExperimentConfig"], Problems]


def team_policies(c: ExperimentConfig) -> Problems:
    """Every role of the run's multi-policy workflow is played by a policy of ``policies``
    (refused at load time, at the key that names it, rather than by every rollout worker at
    its first task); a ``policies`` mapping naming no role is refused too."""
    workflow = c.team_workflow()
    if workflow is None:
        return []
    from astraflow.consumers.rollout.workflows.contracts import CONTRACTS

    roles = CONTRACTS[workflow].roles
    where = ("rollout", "workflow", "kwargs", workflow, "policies")
    mapped = c.team_kwargs().get("policies") or {}
    if not isinstance(mapped, dict):
        return [InitErrorDetails(type=error("bad_mapping", "a mapping role -> policy"),
                                 loc=where, input=mapped)]
    errors = [InitErrorDetails(
        type=error("unknown_role", f"workflow {workflow!r} has no role {role!r}; roles: "
                                   f"{', '.join(roles)}"), loc=(*where, role), input=role)
        for role in mapped if role not in roles]
    latency = c.team_kwargs().get("verifier_latency")
    if latency is not None:  # refused at load time, not by every episode
        from astraflow.consumers.rollout.latency import parse_latency

        try:
            parse_latency(latency, where="verifier_latency")
        except ConfigError as e:
            errors.append(InitErrorDetails(
                type=error("bad_latency", "; ".join(e.problems)),
                loc=("rollout", "workflow", "kwargs", workflow, "verifier_latency"),
                input=latency))
    errors += _tool_check(c, workflow)
    for role, policy in c.team().items():
        if policy in c.policies:
            continue
        loc = (*where, role) if role in mapped else ("policies",)
        errors.append(InitErrorDetails(type=error(
            "role_without_policy",
            f"workflow {workflow!r} role {role!r} is played by policy {policy!r}, which is "
            f"not in policies ({', '.join(c.policies)}): add it to policies, or map "
            f"the role with rollout.workflow.kwargs.{workflow}.policies.{role}"),
            loc=loc, input=policy))
    return errors


def _tool_check(c: ExperimentConfig, workflow: str) -> Problems:
    """A team's ``verifier_tool`` is a registered tool and its ``answer_extract`` an
    extractor: refused at load time, not found wrong by every episode."""
    kw = c.team_kwargs()
    where = ("rollout", "workflow", "kwargs", workflow)
    out: Problems = []
    tool = kw.get("verifier_tool")
    if tool is not None:
        from astraflow.consumers.rollout.tools import TOOLS

        if not isinstance(tool, str) or tool not in TOOLS:
            out.append(InitErrorDetails(type=error(
                "unknown_tool", f"unknown tool {tool!r}; registered: {', '.join(TOOLS.names())}"),
                loc=(*where, "verifier_tool"), input=tool))
    extract = kw.get("answer_extract")
    if extract is not None:
        from astraflow.consumers.rollout.rewards.extract import check_extractor

        try:
            check_extractor(str(extract))
        except ValueError as e:
            out.append(InitErrorDetails(type=error("unknown_extractor", str(e)),
                                        loc=(*where, "answer_extract"), input=extract))
    if kw.get("tool_verdict") and tool is None:
        out.append(InitErrorDetails(type=error(
            "tool_verdict_without_tool", "tool_verdict compares the claim with the tool's "
            "answer: name the tool (verifier_tool: calculator)"),
            loc=(*where, "tool_verdict"), input=True))
    return out


def verifier_work(c: ExperimentConfig) -> Problems:
    """Column work is an addition's: refused at load time for other operators."""
    if c.launch.warmup.verifier_work != "columns":
        return []
    ops = c.producer.arithmetic.ops
    if c.producer.source == "arithmetic" and set(ops) == {"+"}:
        return []
    return [InitErrorDetails(type=error(
        "columns_need_addition", "verifier_work columns writes an addition's column "
        f"sums: it needs producer.source arithmetic with ops ['+'] (here "
        f"{c.producer.source!r}, ops {list(ops)}); use sum or none"),
        loc=("launch", "warmup", "verifier_work"), input="columns")]


def eval_temperature(c: ExperimentConfig) -> Problems:
    """A sampled evaluation is the ``episode`` kind's only (multi-turn workflows)."""
    if c.launch.eval_temperature > 0 and (c.workflow() == "single_turn"
                                          or c.team_workflow() is not None):
        return [InitErrorDetails(type=error(
            "greedy_only", f"workflow {c.workflow()!r} is evaluated greedily (its "
            "answers or verdicts); eval_temperature applies to a multi-turn workflow's "
            "episodes (e.g. multi_turn_tools): set it to 0"),
            loc=("launch", "eval_temperature"), input=c.launch.eval_temperature)]
    return []


def train_on_train(c: ExperimentConfig) -> Problems:
    """The producer releasing arithmetic's test split would train on what the evaluator
    measures: refused while the run evaluates or warms up to a band."""
    pc = c.producer
    if pc.source == "arithmetic" and pc.arithmetic.split == "test" and (
            c.launch.evaluate or c.launch.warmup.target_accuracy is not None):
        return [InitErrorDetails(type=error(
            "trains_on_held_out", "the producer would release the held-out problems the "
            "evaluator measures: keep split: train, or set launch.evaluate: false"),
            loc=("producer", "arithmetic", "split"), input="test")]
    return []


def sampled_eval(c: ExperimentConfig) -> Problems:
    """Sampled evaluation draws at the rollout temperature: refused at 0 (greedy)."""
    if c.launch.eval_samples and c.rollout.engine.temperature <= 0:
        return [InitErrorDetails(type=error(
            "greedy_samples", "eval_samples draws replies at rollout.engine.temperature, "
            "which is 0 (greedy): every sample would be the greedy reply; set "
            "eval_samples: 0 or a temperature"),
            loc=("launch", "eval_samples"), input=c.launch.eval_samples)]
    return []


def tool_latency(c: ExperimentConfig) -> Problems:
    """A bad ``multi_turn_tools.tool_latency`` is refused at load time, at its key, rather
    than by every episode."""
    kw = c.rollout.workflow.kwargs.get("multi_turn_tools") or {}
    if kw.get("tool_latency") is None:
        return []
    from astraflow.consumers.rollout.workflows.multi_turn import parse_tool_latency

    where = ("rollout", "workflow", "kwargs", "multi_turn_tools", "tool_latency")
    try:
        parse_tool_latency(kw["tool_latency"], ".".join(where))
    except ConfigError as e:
        return [InitErrorDetails(type=error("bad_latency", "; ".join(e.problems)),
                                 loc=where, input=kw["tool_latency"])]
    return []


def shared_adapters(c: ExperimentConfig) -> Problems:
    """``rollout.engine.adapters`` names policies of the run, each trained as a LoRA adapter
    (a whole-model trainer's versions cannot go into an adapter slot), of one base model."""
    where = ("rollout", "engine", "adapters")
    names = c.rollout.engine.adapters
    out = unknown(names, c.policies, where, keyed=False)
    if out or not names:
        return out
    full = [p for p in names if c.trainer_for(p).lora is None]
    if full:
        out.append(InitErrorDetails(type=error(
            "adapter_without_lora", f"{', '.join(full)} would be served as LoRA adapters of a "
            "shared base, but their trainers train the whole model: give them trainer.lora "
            "(or trainers.<policy>.lora), or leave them out of rollout.engine.adapters"),
            loc=where, input=names))
    models = {(c.model(p).path, c.model(p).build) for p in names}
    if len(models) > 1 or "{policy}" in c.model(names[0]).path:
        out.append(InitErrorDetails(type=error(
            "adapters_of_several_models", "the policies of rollout.engine.adapters share one "
            "base model: give them the same models.<policy>.path (without {policy})"),
            loc=where, input=names))
    if c.rollout.engine.type != "hf" or c.rollout.engine.continuous or c.rollout.engine.process:
        out.append(InitErrorDetails(type=error(
            "adapters_engine", "rollout.engine.adapters needs the hf engine with continuous: "
            "false and process: false"), loc=where, input=names))
    if len(set(names)) != len(names):
        out.append(InitErrorDetails(type=error("duplicate", "a policy is named twice"),
                                    loc=where, input=names))
    return out


#: every cross-section check, with the top-level sections it reads (``workflow()`` and the
#: team read ``producer`` and ``rollout``)
CHECKS: list[tuple[frozenset[str], Check]] = [
    (frozenset({"producer", "rollout", "policies"}), team_policies),
    (frozenset({"launch", "producer"}), verifier_work),
    (frozenset({"launch", "producer", "rollout"}), eval_temperature),
    (frozenset({"launch", "producer"}), train_on_train),
    (frozenset({"launch", "rollout"}), sampled_eval),
    (frozenset({"rollout"}), tool_latency),
    (frozenset({"rollout", "policies", "trainer", "trainers", "models"}), shared_adapters),
]


def problems(config: ExperimentConfig, failed: Collection[Any] = ()) -> Problems:
    """The problems of every check that reads none of the ``failed`` sections (those are
    the config's defaults in ``config``, and what they would say is not the user's)."""
    return [e for reads, check in CHECKS if reads.isdisjoint(failed) for e in check(config)]


def again(err: Any) -> InitErrorDetails:
    """A reported error (``ValidationError.errors()``) as it goes into a new ValidationError:
    its type, text, place and value kept."""
    return InitErrorDetails(type=error(err["type"], err["msg"]), loc=err["loc"],
                            input=err.get("input"))


def unknown(value: Iterable[str], policies: list[str] | None, where: tuple[str, ...] = (),
            *, keyed: bool = True) -> Problems:
    """One error per name in ``value`` (a mapping's keys, located under ``where`` + the key;
    with ``keyed=False`` plain values, located at ``where``) that is not a policy; none when
    ``policies`` itself failed validation."""
    if policies is None:
        return []
    return [InitErrorDetails(
        type=error("unknown_policy", f"unknown policy {name!r}; valid (policies): "
                                     f"{', '.join(policies)}; add it to policies or fix the "
                                     "name"),
        loc=(*where, name) if keyed else where, input=name)
        for name in value if name not in policies]


def trainer_error(err: Any) -> PydanticCustomError:
    """An error inside a merged trainer section; an unknown key lists the valid ones (the
    generic hint cannot walk into ``trainers``' free-form dicts)."""
    if err["type"] != "extra_forbidden":
        return error(err["type"], err["msg"])
    section: Any = TrainerConfig
    for part in err["loc"][:-1]:
        section = section.model_fields[part].annotation
    return error("unknown_key", f"unknown key; valid keys here: "
                                f"{', '.join(sorted(section.model_fields))}")


def error(kind: str, message: str) -> PydanticCustomError:
    # the message is final text: braces in it are escaped from the template formatting
    return PydanticCustomError(kind, message.replace("{", "{{").replace("}", "}}"))


def refuse(errors: Problems) -> None:
    # a ValidationError raised in a field validator keeps its line errors, each located
    # under the field, so every bad key is reported at once with its own path
    if errors:
        raise pydantic.ValidationError.from_exception_data("ExperimentConfig", errors)
