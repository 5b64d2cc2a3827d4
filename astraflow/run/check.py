"""``astraflow check CONFIG``: what would fail at runtime, found before any role starts.

Models, tokenizers, data splits, the modules the config names, the reward and a memory
estimate are checked, and every problem is reported at once with the key path to fix;
`astraflow run` runs it first. ``roles`` limits it to what one host of several needs
(docs/check.md).

>>> report = check_experiment(config, out)
>>> report.ok, [f"{f.key}: {f.message}" for f in report.problems]
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.core.errors import AstraflowError

if TYPE_CHECKING:
    from astraflow.config import ExperimentConfig
    from astraflow.producers.sources import TaskSpec
    from astraflow.run.memory import MemoryEstimate

#: demonstrations or tasks read per split: enough to find a bad file, few enough to be quick
ROWS = 3

#: the role commands a host may run (``astraflow ROLE CONFIG``), for ``check_experiment(roles=)``
ROLES = ("produce", "policy", "rollout", "train", "evaluate", "serve")
#: which checks each role needs: the data splits it reads, what it imports, what it loads
READS_TRAIN = {"produce"}
READS_TEST = {"produce", "evaluate"}
RUNS_WORKFLOW = {"rollout", "evaluate"}
RUNS_POLICIES = {"policy"}
LOADS_MODEL = {"rollout", "train", "evaluate", "serve"}
RUNS_ENGINE = {"rollout", "serve"}


@dataclass(frozen=True)
class Finding:
    """One result of the check: ``ok`` False is a problem at config key ``key``."""

    key: str
    message: str
    ok: bool = True


@dataclass
class CheckReport:
    findings: list[Finding] = field(default_factory=list)

    def good(self, key: str, message: str) -> None:
        self.findings.append(Finding(key, message))

    def bad(self, key: str, message: str) -> None:
        self.findings.append(Finding(key, message, ok=False))

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe_problems(self) -> str:
        return "\n".join(f"  {f.key}: {f.message}" for f in self.problems)


class CheckFailed(AstraflowError):
    """A config that `astraflow check` refuses (every problem in the message)."""

    def __init__(self, report: CheckReport) -> None:
        self.report = report
        n = len(report.problems)
        super().__init__(f"the config fails its check ({n} problem{'s' * (n != 1)}; "
                         f"`astraflow check CONFIG` shows every check):\n"
                         f"{report.describe_problems()}")


def check_experiment(config: ExperimentConfig, out: str | Path = ".", *, weights: bool = True,
                     progress: Callable[[str], None] = lambda _: None,
                     gpu_gb: float = 80.0,
                     roles: Collection[str] | None = None) -> CheckReport:
    """Every check of :mod:`astraflow.run.check` on ``config`` (run directory ``out``).
    ``weights`` False: a model folder with its config and tokenizer passes without its
    weights, and an engine's package need not be installed (a config prepared where it does
    not run, e.g. a GPU recipe checked in CI). ``gpu_gb``: the GPU the trainer's memory is
    compared with (the largest model that fits). ``roles``: the role commands (:data:`ROLES`)
    this host runs; only what they need is checked (None: every role)."""
    report = CheckReport()
    here = set(ROLES if roles is None else roles)
    unknown = sorted(here - set(ROLES))
    if unknown:
        raise AstraflowError(f"unknown role(s) {', '.join(map(repr, unknown))}; valid: "
                             f"{', '.join(ROLES)}")
    if roles is not None:
        report.good("roles", f"checked for a host that runs {', '.join(sorted(here))}")
    progress("reading the data")
    sample = _check_data(config, out, report, here)
    progress("importing modules and scoring a sample")
    if here & RUNS_WORKFLOW:
        _check_modules(config, report)
        _check_reward(config, sample, report)
    if here & RUNS_POLICIES:
        _check_policies(config, report)
    if here & RUNS_ENGINE:
        _check_engine(config, report, installed=weights)
    if not here & LOADS_MODEL:
        return report
    estimates = []
    for policy in config.policies:
        progress(f"loading the tokenizer of {policy}")
        est = _check_model(config, policy, out, sample, report, weights=weights, gpu_gb=gpu_gb)
        if est is not None:
            estimates.append(est)
    if len(config.policies) > 1 and len(estimates) == len(config.policies):
        _check_run_memory(config, estimates, report)
    return report


# data ------------------------------------------------------------------------------------------

def _source_key(config: ExperimentConfig, split: str) -> str:
    """The key that names where ``split`` comes from (a file source's held-out split:
    ``producer.test_path``, or ``producer.test_fraction`` without one)."""
    pc = config.producer
    if pc.source in ("arithmetic", "reasoning_gym", "hf_datasets"):
        return f"producer.{pc.source}"
    if split == "test":
        return "producer.test_path" if pc.test_path else "producer.test_fraction"
    return "producer.path"


def _check_data(config: ExperimentConfig, out: str | Path, report: CheckReport,
                roles: Collection[str] = ROLES) -> TaskSpec | None:
    """The first rows of the train split (and of the held-out split when the run evaluates
    or warms up to a band), where ``roles`` read them; returns a train task to score and
    render, or None."""
    from astraflow.producers import split_specs

    sample = None
    splits = ["train"] if READS_TRAIN & set(roles) else []
    if READS_TEST & set(roles) and (config.launch.evaluate
                                    or config.launch.warmup.target_accuracy is not None):
        splits.append("test")
    if not splits:
        report.good(_source_key(config, "train"), "not read here (the producer and the "
                    "evaluator read the data; this host runs neither)")
    for split in splits:
        key = _source_key(config, split)
        try:
            rows = list(islice(split_specs(config.producer, split, out), ROWS))  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - a data library may raise anything on a bad file
            report.bad(key, f"{split} split: {e}" if isinstance(e, AstraflowError | OSError)
                       else f"{split} split: {type(e).__name__}: {e}")
            continue
        if not rows:
            report.bad(key, f"the {split} split is empty" + (
                " (the evaluator and the warm-up's checks measure the held-out split: give "
                "the source one, or set launch.evaluate: false)" if split == "test" else ""))
            continue
        if split == "train":
            sample = rows[0]
            missing = [s.id for s in rows if "answer" not in s.reference]
            if missing and config.launch.warmup.steps:
                report.bad("launch.warmup.steps", f"the SFT warm-up trains on reference "
                           f"answers, and task {missing[0]!r} has none (its reference keys: "
                           f"{sorted(rows[0].reference)}); map one with producer.fields or "
                           "set launch.warmup.steps: 0")
        report.good(key, f"{split} split: first task {rows[0].id!r}: "
                         f"{_short(rows[0].prompt[-1].content)}")
    return sample


def _short(text: str, n: int = 70) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[:n - 1] + "…"


# modules and the reward -------------------------------------------------------------------------

def _check_modules(config: ExperimentConfig, report: CheckReport) -> None:
    """The workflow modules import, the run's workflow resolves."""
    from astraflow.consumers.rollout.workflows import WORKFLOWS

    for i, module in enumerate(config.rollout.workflow.modules):
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - a user module may raise anything on import
            report.bad(f"rollout.workflow.modules[{i}]",
                       f"cannot import {module!r}: {type(e).__name__}: {e}")
    workflow = config.workflow()
    key = ("producer.workflow" if config.producer.workflow != "single_turn"
           else "rollout.workflow.default")
    try:
        WORKFLOWS.resolve(workflow)
        report.good(key, f"workflow {workflow!r}")
    except Exception as e:  # noqa: BLE001 - a module path may raise anything on import
        report.bad(key, str(e))


def _check_policies(config: ExperimentConfig, report: CheckReport) -> None:
    """The custom data policies load."""
    from astraflow.policies.config import STAGES, is_custom
    from astraflow.policies.registry import load_factory

    for stage in STAGES:
        for i, entry in enumerate(getattr(config.data, stage)):
            name = entry if isinstance(entry, str) else getattr(entry, "name", str(entry))
            if is_custom(name):
                try:
                    load_factory(name, f"data.{stage}[{i}]")
                except AstraflowError as e:
                    report.bad(f"data.{stage}[{i}]", str(e))


def _check_engine(config: ExperimentConfig, report: CheckReport, *, installed: bool) -> None:
    """The engine's package is installed where the engines run (``installed`` False: a
    config checked away from its hosts, where its absence is noted, not a problem)."""
    import importlib.util

    engine = config.rollout.engine.type
    if engine != "vllm":
        return
    if importlib.util.find_spec("vllm") is not None:
        report.good("rollout.engine.type", "vllm is installed")
    elif installed:
        report.bad("rollout.engine.type", "vllm is configured and not installed on this host: "
                   "pip install vllm (it needs a CUDA GPU), or rollout.engine.type: hf")
    else:
        report.good("rollout.engine.type", "vllm is not installed here (not checked: "
                    "--no-weights, a config checked away from its hosts)")


def _check_reward(config: ExperimentConfig, sample: TaskSpec | None,
                  report: CheckReport) -> None:
    """The reward resolves, and scores the sample's reference answer (a reward that raises on
    a real task would score every episode 0, silently counted as reward_failures)."""
    from astraflow.consumers.rollout.rewards import build_reward
    from astraflow.consumers.rollout.rewards.sandbox import configure

    rc = config.rollout.reward
    if rc.extract != "none":
        from astraflow.consumers.rollout.rewards.extract import EXTRACTORS

        try:  # a user's module:function is only checked for its form when the config loads
            EXTRACTORS.resolve(rc.extract)
        except Exception as e:  # noqa: BLE001 - a module path may raise anything on import
            report.bad("rollout.reward.extract", str(e))
    try:
        # scored without the answer extractor: the reference answer is the bare answer, not a
        # reply in the format the extractor looks for (the extractor's name is checked when
        # the config loads)
        configure(allow_same_uid=config.rollout.sandbox.allow_same_uid)  # as the workers do
        reward = build_reward(rc.model_copy(update={"extract": "none"}))
    except Exception as e:  # noqa: BLE001 - a module path may raise anything on import
        report.bad("rollout.reward.name", str(e))
        return
    if sample is None:
        return
    answer = str(sample.reference.get("answer", ""))
    try:
        value = float(reward(answer, sample.reference))
    except Exception as e:  # noqa: BLE001 - the user's reward: report whatever it raises
        report.bad("rollout.reward", f"{rc.name!r} raised on task {sample.id!r} (its reference "
                   f"answer as the completion): {type(e).__name__}: {e}")
        return
    if not math.isfinite(value):
        report.bad("rollout.reward", f"{rc.name!r} scored task {sample.id!r} {value}")
        return
    report.good("rollout.reward", f"{rc.name!r} scores task {sample.id!r}'s reference answer "
                                  f"{value:g}")


# models -----------------------------------------------------------------------------------------

def _check_model(config: ExperimentConfig, policy: str, out: str | Path,
                 sample: TaskSpec | None, report: CheckReport, *, weights: bool,
                 gpu_gb: float = 80.0) -> MemoryEstimate | None:
    """The checks of ``policy``'s model; its memory estimate where its config is known."""
    from dataclasses import replace

    from astraflow.core.paths import expand
    from astraflow.models.source import describe_model

    mc = config.model(policy)
    key = f"models.{policy}.path"
    info = describe_model(expand(mc.path, out=out, policy=policy), build=mc.build, key=key)
    if not weights and info.kind == "folder" and info.config is not None:
        # a folder with its config.json: missing weights are its only possible problem
        info = replace(info, problems=(), notes=(*info.notes, "weights not checked"))
    for problem in info.problems:
        report.bad(key, problem)
    if info.problems:
        return None
    report.good(key, info.describe())
    if info.folder is None:  # built at start (a tiny model)
        return None
    try:
        from astraflow.models.load import load_tokenizer

        tok = load_tokenizer(info.folder)
    except Exception as e:  # noqa: BLE001 - a broken tokenizer file may raise anything
        report.bad(key, f"cannot load the tokenizer of {info.folder}: {type(e).__name__}: {e}")
        return None
    if len(tok) < 2:  # transformers builds an empty one where the folder has no tokenizer files
        report.bad(key, f"the tokenizer of {info.folder} is empty ({len(tok)} token): the folder "
                        "has no tokenizer files (tokenizer.json, or its tokenizer's vocabulary "
                        "files); copy them from the model's repository")
        return None
    if sample is not None:
        _check_prompt(config, policy, tok, sample, report)
    if info.config is None:
        return None
    return _check_memory(config, policy, info.config, report, info.parameters, gpu_gb)


def _check_prompt(config: ExperimentConfig, policy: str, tok: Any, sample: TaskSpec,
                  report: CheckReport) -> None:
    from astraflow.models.prompt import render_prompt
    from astraflow.producers import with_system

    messages = with_system(sample.prompt, config.producer.system_prompt)
    key = f"models.{policy}.path"
    try:
        text, ids = render_prompt(tok, messages)
    except Exception as e:  # noqa: BLE001 - a chat template may raise anything
        report.bad(key, f"the chat template fails on task {sample.id!r}: "
                        f"{type(e).__name__}: {e}")
        return
    template = "its chat template" if getattr(tok, "chat_template", None) else \
        "no chat template (contents concatenated)"
    report.good(key, f"one prompt renders with {template}: {len(ids)} tokens, "
                     f"{_short(repr(text), 90)}")
    if tok.eos_token_id is None:
        report.bad(key, "the tokenizer has no EOS token: generations would never stop before "
                        "rollout.engine.max_new_tokens")


def _check_memory(config: ExperimentConfig, policy: str, model_config: dict[str, Any],
                  report: CheckReport, params: int | None,
                  gpu_gb: float = 80.0) -> MemoryEstimate:
    from astraflow.run.memory import describe_trainer, estimate

    est = estimate(model_config, config, policy, params)
    report.good(f"models.{policy}", est.describe())
    report.good(f"trainer.{policy}.memory", describe_trainer(est, gpu_gb))
    _check_precision(config, policy, report)
    limit = est.available_bytes()
    if limit is not None and est.host_bytes > limit:
        report.bad(f"models.{policy}", f"the roles on this host need about "
                   f"{est.host_bytes / 2**30:.1f} GiB ({est.describe()}), more than its "
                   f"{limit / 2**30:.1f} GiB: fewer launch.rollout_workers, a smaller "
                   "rollout.engine.max_batch_size, or a bigger machine")
    return est


def _check_precision(config: ExperimentConfig, policy: str, report: CheckReport) -> None:
    """What ``trainer.mixed_precision`` computes in on this host's CPU (a trainer that runs on
    a GPU is not judged here): ``auto``'s choice, or why ``bf16`` will be slow."""
    from astraflow.consumers.trainer.precision import on_cpu, resolve, slow_bf16

    tc = config.trainer_for(policy)
    if not on_cpu(tc.device):
        return
    key = f"trainer.{policy}.mixed_precision"
    slow = slow_bf16(tc.mixed_precision, cpu=True)
    if slow:
        report.good(key, f"warning: {slow}")
    elif tc.mixed_precision == "auto":
        got = resolve("auto", cpu=True)
        report.good(key, "auto: bf16 on this CPU (it has bf16 instructions)" if got == "bf16"
                    else "auto: fp32 on this CPU (no bf16 instructions)")


def _check_run_memory(config: ExperimentConfig, estimates: Sequence[MemoryEstimate],
                      report: CheckReport) -> None:
    """Several policies on one CPU host: their roles together (a trainer and an evaluator
    each, every rollout worker holding an engine of each, a team's evaluator all its models)
    against the host's memory; each policy's own check does not see the others."""
    from astraflow.run.memory import run_host_bytes

    limit = estimates[0].available_bytes()
    if limit is None or any(e.device != "cpu" for e in estimates):
        return
    team = config.launch.evaluate and config.team_workflow() == "solver_verifier"
    need = run_host_bytes(estimates, team_evaluator=team)
    gib = 2**30
    what = (f"the roles of the {len(estimates)} policies on this host need about "
            f"{need / gib:.1f} GiB together")
    if need > limit:
        report.bad("policies", f"{what}, more than its {limit / gib:.1f} GiB: a smaller "
                   "trainer.micro_batch_tokens, fewer launch.rollout_workers, a smaller "
                   "rollout.engine.max_batch_size, or a bigger machine")
    else:
        report.good("policies", f"{what} (of {limit / gib:.1f} GiB)")
