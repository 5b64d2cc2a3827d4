"""The sections of the experiment config that belong to no role: where the bus is
(``bus``) and how `astraflow run` lays the roles out on this host (``launch``, with its SFT
warm-up). Each role's own section lives with the role (its ``config.py``).
"""

from __future__ import annotations

from typing import Literal

import pydantic

from astraflow.core.bus.url import DEFAULT_URL
from astraflow.core.config import Section
from astraflow.weights.config import StoreConfig


class BusConfig(Section):
    """Where the topics live."""

    url: str = pydantic.Field(
        DEFAULT_URL,
        description="embedded:///path/bus.db or kafka://host:port[,host:port]; {out} is the "
                    "run directory")
    options: dict[str, str] = pydantic.Field(
        default_factory=dict, description="extra client settings (Kafka: SASL/SSL, ...)")
    partitions: dict[str, int] = pydantic.Field(
        default_factory=dict, description="partition count per logical topic, e.g. tasks: 8")
    claims: StoreConfig | None = pydantic.Field(
        StoreConfig(path="{out}/claims"),
        description="where records over the bus's message limit go by claim check (a long "
                    "agentic episode): a file or http store that producers and readers share "
                    "({out}: the run directory, so one host only); null: such records fail")


class PolicyWarmupConfig(Section):
    """One policy's own warm-up settings, laid over ``launch.warmup``'s (null: the shared
    value). A verifier measured by balanced judgement accuracy needs another band than a
    solver measured by answer accuracy."""

    target_accuracy: tuple[float, float] | None = pydantic.Field(
        None, description="[low, high] for this policy (its held-out measure: answer "
                          "accuracy, or for a verifier balanced judgement accuracy)")
    lr: float | None = pydantic.Field(None, gt=0, description="SFT learning rate")
    steps: int | None = pydantic.Field(None, ge=0, description="SFT steps (the cap with a band)")

    @pydantic.field_validator("target_accuracy")
    @classmethod
    def _band(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not 0.0 <= band[0] < band[1] <= 1.0:
            raise ValueError(f"target_accuracy {list(band)} must be [low, high] with "
                             "0 <= low < high <= 1")
        return band


class WarmupConfig(Section):
    """An SFT warm-up before RL: demonstrations (the producer's train split with its reference
    answers) go through the bus to the trainer in ``sft`` mode; RL starts from the result:
    after ``steps`` steps, or at the first check inside ``target_accuracy`` (see
    :mod:`astraflow.run.warmup`)."""

    steps: int = pydantic.Field(0, ge=0, description="SFT steps before RL (with "
                                                      "target_accuracy: the most); 0: none")
    batch_size: int = pydantic.Field(256, ge=1, description="demonstrations per SFT step")
    lr: float = pydantic.Field(2e-3, gt=0, description="SFT learning rate")
    grad_clip: float | None = pydantic.Field(None, gt=0,
                                             description="SFT gradient-norm clip; null: off")
    target_accuracy: tuple[float, float] | None = pydantic.Field(
        None, description="[low, high]: stop the warm-up at the first check whose held-out "
                          "greedy accuracy (launch.eval_problems of the producer's test split) "
                          "is inside this band, and start RL there; `steps` is then the cap. "
                          "null: exactly `steps` steps")
    check_every: int = pydantic.Field(
        10, ge=1, description="with target_accuracy: checkpoint and measure every N SFT steps")
    on_miss: Literal["error", "closest"] = pydantic.Field(
        "error", description="with target_accuracy, when no check was inside the band by "
                             "`steps`: error (the run fails, RL does not start) or closest "
                             "(RL starts from the check nearest the band, with a warning)")
    retry_every: int = pydantic.Field(
        4, ge=0, description="a solver_verifier team's solver also learns the retry protocol: "
                             "one retry demonstration (a rejected answer, the verifier's text, "
                             "the right answer) per N problems; 0: none")
    verifier_work: Literal["sum", "columns", "none"] = pydantic.Field(
        "sum", description="a solver_verifier team's verifier: what its demonstrations write "
                           "before the verdict line. sum: its own answer (\"46\\nno\"); "
                           "columns: an addition's column sums, units first, then its own "
                           "answer (\"2+9=11\\n1+3+1=5\\n51\\nno\"; producer.arithmetic.ops "
                           "[\"+\"] only; give the verifier room: role_sampling.verifier."
                           "max_new_tokens); none: the verdict alone")
    policies: dict[str, PolicyWarmupConfig] = pydantic.Field(
        default_factory=dict, description="per policy: its own target_accuracy, lr, steps "
                                          "(e.g. verifier: {target_accuracy: [0.6, 0.75]})")

    def band(self, policy: str) -> tuple[float, float] | None:
        """The target band of ``policy`` (its own, else the shared one)."""
        own = self.policies.get(policy)
        return own.target_accuracy if own and own.target_accuracy else self.target_accuracy

    def lr_of(self, policy: str) -> float:
        own = self.policies.get(policy)
        return own.lr if own and own.lr is not None else self.lr

    def steps_of(self, policy: str) -> int:
        own = self.policies.get(policy)
        return own.steps if own and own.steps is not None else self.steps

    @pydantic.model_validator(mode="after")
    def _band(self) -> WarmupConfig:
        if self.target_accuracy is None:
            return self
        low, high = self.target_accuracy
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"target_accuracy {[low, high]} must be [low, high] with "
                             "0 <= low < high <= 1, e.g. [0.2, 0.3]")
        # steps: 0 stays valid with a band: no warm-up at all (`--set launch.warmup.steps=0`
        # starts RL from a given model), so the band is moot
        return self


class LaunchConfig(Section):
    """How `astraflow run` lays the roles out on this host."""

    rollout_workers: int = pydantic.Field(2, ge=1, description="rollout processes")
    trainer_ranks: int = pydantic.Field(
        1, ge=1, description="processes per policy's trainer (one rank each, one process "
        "group: trainer.parallel says how they split the work); they run as a gang that "
        "restarts as a whole, from the last checkpoint, when any rank dies")
    rollout_speeds: list[float] | None = pydantic.Field(
        None, description="per rollout process, its rollout.engine.speed (one per worker, "
        "in (0, 1]), e.g. [1.0, 0.6, 0.3]: workers standing in for GPUs of different speeds; "
        "rollout-<i> gets the i-th. Workers the scaler adds later run at rollout.engine.speed "
        "(or what their pool's actuator.rollout_args set); null: every worker at "
        "rollout.engine.speed")
    evaluate: bool = pydantic.Field(True, description="run the held-out evaluator")
    eval_problems: int = pydantic.Field(500, ge=1, description="held-out problems per eval")
    eval_samples: int = pydantic.Field(
        0, ge=0, le=64, description="answer evaluations (single_turn): also this many sampled "
        "completions per held-out problem at rollout.engine.temperature, reported as "
        "eval_sampled_accuracy (what RL's train reward estimates), eval_pass_at_k and "
        "eval_majority_accuracy (maj@k: the answer most of them give, by rollout.reward."
        "extract; a tie goes to the one given first); 0: greedy only")
    eval_device: str = pydantic.Field(
        "cpu", description="where the held-out evaluators run their model: cpu, cuda, "
        "cuda:1, ... (a GPU run's evaluator on its CPU would take hours for a 1B model)")
    eval_every: int = pydantic.Field(
        10, ge=1, description="evaluate every N weight versions (and always the last one)")
    eval_nice: int = pydantic.Field(
        10, ge=0, le=19, description="scheduling niceness added to the evaluator processes: "
        "they measure, and training should not share the cores with them on a full machine "
        "(0: the same priority as the training roles)")
    eval_temperature: float = pydantic.Field(
        0.0, ge=0.0, le=2.0, description="sampling temperature of the held-out evaluation of "
        "a multi-turn workflow (the evaluator's `episode` kind and the warm-up's checks): 0 is "
        "greedy; the rollout temperature measures the policy RL samples from (a tool call of "
        "~25 tokens can be right greedily long before a sample gets all of them right). "
        "Single-turn answers and verdicts are always greedy")
    restart: bool = pydantic.Field(True, description="restart a role that dies")
    max_restarts: int = pydantic.Field(3, ge=0, description="restarts per role")
    stop_grace_s: float = pydantic.Field(30.0, gt=0,
                                         description="SIGTERM → SIGKILL grace when stopping")
    threads_per_role: int | None = pydantic.Field(
        1, ge=1, description="OMP/MKL/torch threads per role process (many processes share "
                             "few cores); null: the libraries' defaults")
    share_cores: bool = pydantic.Field(
        True, description="the trainer and the rollout workers of a CPU host share its cores: "
        "each has a share (launch.cores / their number, at least 1) and an idle one lends its "
        "share to the busy rollout workers (a worker takes the trainer's core while the "
        "trainer waits for a batch), checked before every decoding step; the trainer keeps "
        "its own threads, so that its steps are bit-for-bit the same whoever else is busy "
        "(docs/metrics.md); false: each keeps launch.threads_per_role / its own threads "
        "setting")
    cores: int | None = pydantic.Field(
        None, ge=1, description="cores the shared roles may use (launch.share_cores); null: "
        "every core this process may run on")
    timeout_s: float | None = pydantic.Field(
        None, gt=0, description="stop the RL phase after this long (the warm-up not counted)")
    stop_at_accuracy: float | None = pydantic.Field(
        None, gt=0, le=1, description="stop the RL phase once every evaluator has measured at "
                                      "least this held-out accuracy (needs evaluate: true); "
                                      "null: run to the step budget or timeout")
    metrics_port_base: int | None = pydantic.Field(
        None, ge=1024, le=65000,
        description="serve every RL-phase role's metrics for Prometheus on its own port, from "
                    "this one up (role i: base + i), and list them in "
                    "{out}/prometheus-targets.json (file_sd); null: no endpoints")
    # -- progress without a terminal ------------------------------------------------------
    progress_every_s: float = pydantic.Field(
        10.0, gt=0, description="when stdout is not a terminal (a pipe, a log file) or with "
        "--no-live: print one plain progress line this often (phase, step, reward, held-out "
        "accuracy, episodes/s, wait ratio, lag); --quiet prints none")
    # -- end of progress without a terminal -----------------------------------------------
    warmup: WarmupConfig = WarmupConfig()

    @pydantic.field_validator("rollout_speeds")
    @classmethod
    def _speeds(cls, speeds: list[float] | None,
                info: pydantic.ValidationInfo) -> list[float] | None:
        if speeds is None:
            return None
        problems = [f"[{i}] = {v!r} is not in (0, 1]" for i, v in enumerate(speeds)
                    if not 0 < v <= 1]
        n = info.data.get("rollout_workers")
        if n is not None and len(speeds) != n:
            problems.append(f"{len(speeds)} speed(s) for launch.rollout_workers = {n}: give one "
                            "per worker, or null for rollout.engine.speed everywhere")
        if problems:
            raise ValueError("; ".join(problems))
        return speeds

    def rollout_speed(self, worker: int) -> float | None:
        """The engine speed of `astraflow run`'s rollout worker number ``worker`` (None: the
        config's rollout.engine.speed)."""
        speeds = self.rollout_speeds
        return speeds[worker] if speeds is not None and worker < len(speeds) else None

    @pydantic.model_validator(mode="after")
    def _stop_needs_eval(self) -> LaunchConfig:
        if self.stop_at_accuracy is not None and not self.evaluate:
            raise ValueError("stop_at_accuracy needs the evaluator: set evaluate: true or "
                             "stop_at_accuracy: null")
        return self
