"""Config section ``trainer``: mode, optimizer, loss switches, micro-batching, checkpoints.

Every key is documented in docs/trainer.md with the formula it switches (defaults:
docs/config.md). The section imports nothing heavy; :mod:`astraflow.consumers.trainer.build`
makes torch objects from it. ``trainers.<policy>`` lays a partial section over it for one
policy (:func:`with_overrides`). An example, checked by tests/test_config_examples.py:

    trainer:
      mode: rl                      # rl | sft
      optimizer: {lr: 3.0e-4}
      loss:
        std_norm: true              # false: Dr. GRPO
        aggregation: token-mean     # | seq-mean-token-mean | seq-mean-token-sum-norm
        eps_low: 0.2
        eps_high: 0.28              # asymmetric clip (DAPO's clip-higher)
        dual_clip: 3.0              # null: off
        kl: k3                      # none | k1 | k3, against the frozen initial model
        kl_coef: 0.001
      checkpoint_every: 50
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic

from astraflow.core.config import Section


class OptimizerConfig(Section):
    """AdamW (decoupled weight decay) on fp32 master weights."""

    type: Literal["adamw"] = pydantic.Field("adamw", description="optimizer; only adamw today")
    lr: float = pydantic.Field(3e-4, gt=0, description="learning rate (constant)")
    betas: tuple[float, float] = pydantic.Field((0.9, 0.999), description="AdamW betas")
    weight_decay: float = pydantic.Field(0.0, ge=0, description="decoupled weight decay")
    eps: float = pydantic.Field(1e-8, gt=0, description="AdamW epsilon")
    warmup_steps: int = pydantic.Field(0, ge=0,
                                       description="linear lr warm-up from 0 over this many "
                                                   "steps; 0: none")

    @pydantic.field_validator("betas")
    @classmethod
    def _betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {list(betas)}")
        return betas


class LossConfig(Section):
    """The RL loss: GRPO-family switches and the decoupled-PPO staleness correction."""

    std_norm: bool = pydantic.Field(
        True, description="divide group-relative advantages by the group's reward std "
                          "(GRPO); false: only subtract the mean (Dr. GRPO)")
    adv_eps: float = pydantic.Field(1e-6, gt=0, description="added to the std before dividing")
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        pydantic.Field("token-mean",
                       description="how per-token losses become one number: token-mean "
                                   "(DAPO), seq-mean-token-mean (GRPO), "
                                   "seq-mean-token-sum-norm (Dr. GRPO)"))
    norm_length: int | None = pydantic.Field(
        None, ge=1, description="seq-mean-token-sum-norm: the constant each sequence's token "
                                "sum is divided by (e.g. the generation budget); null: the "
                                "longest completion (loss tokens) in the batch")
    eps_low: float = pydantic.Field(0.2, gt=0, lt=1,
                                    description="ratio clip below: 1 - eps_low")
    eps_high: float = pydantic.Field(0.2, gt=0,
                                     description="ratio clip above: 1 + eps_high (0.28: DAPO)")
    dual_clip: float | None = pydantic.Field(
        None, gt=1, description="dual clip c > 1: for negative advantages the loss is at most "
                                "-c·A; null: off")
    kl: Literal["none", "k1", "k3"] = pydantic.Field(
        "none", description="KL penalty to the frozen initial model, per token: k1 = log π/π_ref,"
                            " k3 = π_ref/π - log(π_ref/π) - 1")
    kl_coef: float = pydantic.Field(0.0, ge=0, description="weight of the KL penalty")
    entropy_coef: float = pydantic.Field(0.0, ge=0,
                                         description="entropy bonus weight (loss -= coef·H)")
    entropy_metric: bool = pydantic.Field(
        True, description="report the mean token entropy (one extra pass over the logits)")
    decoupled: bool = pydantic.Field(
        True, description="decoupled PPO (AReaL): clip π_θ/π_prox and weight by π_prox/π_behav;"
                          " false: clip π_θ/π_behav (plain PPO against the rollout's logprobs)")
    behaviour_cap: float | None = pydantic.Field(
        5.0, gt=0, description="cap of the behaviour importance weight π_prox/π_behav; null: "
                               "uncapped")
    behaviour_cap_mode: Literal["clip", "mask", "mask_both"] = pydantic.Field(
        "clip", description="clip: weight = min(w, cap) (truncated IS); mask: tokens with "
                            "w > cap get weight 0 (AReaL); mask_both: tokens with w outside "
                            "[1/cap, cap] get weight 0 (IcePop's two-sided mask; cap > 1)")
    behaviour_level: Literal["token", "sequence", "geometric"] = pydantic.Field(
        "token", description="token: each token's own π_prox/π_behav; sequence: every token of "
                             "a sequence gets the product over its loss tokens (the whole "
                             "sequence's ratio, which also weighs the prefixes an older policy "
                             "led to); geometric: the geometric mean of its tokens' ratios "
                             "(length-independent); either capped by behaviour_cap")
    temperature: float = pydantic.Field(
        1.0, gt=0, description="sampling temperature of the rollout: logits are divided by it "
                               "before log-softmax so ratios compare like with like")

    @pydantic.model_validator(mode="after")
    def _two_sided_cap(self) -> LossConfig:
        if (self.behaviour_cap_mode == "mask_both" and self.behaviour_cap is not None
                and self.behaviour_cap <= 1):
            raise ValueError("behaviour_cap_mode mask_both keeps w in [1/behaviour_cap, "
                             f"behaviour_cap]: set behaviour_cap > 1 (got {self.behaviour_cap})")
        return self


class FsdpConfig(Section):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) settings, used when
    ``trainer.parallel: fsdp``: every transformer block and then the root are sharded over
    the trainer's ranks, so each rank holds 1/N of the weights, gradients and AdamW state."""

    param_dtype: Literal["fp32", "bf16", "fp16"] = pydantic.Field(
        "fp32", description="dtype the gathered parameters compute in (the sharded master "
                            "weights and the optimizer stay fp32)")
    reduce_dtype: Literal["fp32", "bf16"] = pydantic.Field(
        "fp32", description="dtype gradients are reduce-scattered in (fp32: exact sums "
                            "across ranks even with bf16 params)")
    cpu_offload: bool = pydantic.Field(
        False, description="keep the sharded parameters, gradients and optimizer state in "
                           "CPU memory (FSDP2 CPUOffloadPolicy; the optimizer steps on CPU)")
    activation_checkpointing: bool = pydantic.Field(
        False, description="recompute each transformer block's activations in the backward "
                           "instead of keeping them (less memory, ~1/3 more compute)")
    reshard_after_forward: bool = pydantic.Field(
        True, description="free the gathered block weights after its forward (ZeRO-3); false "
                          "keeps them until the backward (ZeRO-2-like: more memory, fewer "
                          "all-gathers)")


class LoraSection(Section):
    """LoRA through peft (``trainer.lora``; docs/trainer.md#lora): only the adapter trains and
    is published; the base model stays frozen at ``models.<policy>``."""

    r: int = pydantic.Field(8, ge=1, description="adapter rank")
    alpha: float = pydantic.Field(16.0, gt=0,
                                  description="scaling numerator: the update is (alpha/r)·B·A")
    dropout: float = pydantic.Field(0.0, ge=0, lt=1,
                                    description="dropout on the adapter's input in SFT (RL steps "
                                                "run the model in eval mode: no dropout)")
    target_modules: list[str] = pydantic.Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="names of the linear modules that get an adapter (peft's target_modules; "
                    "[all-linear]: every linear layer but the output head)")


class MismatchConfig(Section):
    """Train–inference mismatch (docs/trainer.md): the trainer reports, every step, how far the
    engine's logprobs of the tokens it trains are from its own, and warns (or stops) when the
    tokens sampled at its own version differ by more than these bounds."""

    token_threshold: float = pydantic.Field(
        0.5, gt=0, description="a token whose |log π_trainer − log π_engine| exceeds this "
                               "counts in mismatch_beyond_<fresh|stale>")
    max_k3: float | None = pydantic.Field(
        0.01, gt=0, description="alarm when the mean k3 KL(engine ‖ trainer) of a step's fresh "
                                "tokens (sampled at the trainer's version) exceeds this; null: "
                                "no bound")
    max_beyond: float | None = pydantic.Field(
        None, gt=0, le=1, description="alarm when this share of a step's fresh tokens or more "
                                      "is beyond token_threshold; null: no bound")
    on_breach: Literal["warn", "stop"] = pydantic.Field(
        "warn", description="warn: a warning line and mismatch_alarm 1 in the step's metrics; "
                            "stop: also end training after that step (checkpointed)")


class TrainerConfig(Section):
    """The trainer: consumes batches.<policy>, steps the optimizer, publishes weights."""

    mode: Literal["rl", "sft"] = pydantic.Field(
        "rl", description="rl: GRPO-family policy loss; sft: cross-entropy on masked tokens")
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: LossConfig = LossConfig()
    lora: LoraSection | None = pydantic.Field(
        None, description="LoRA adapter {r, alpha, dropout, target_modules}; null: full "
                          "fine-tuning")
    mismatch: MismatchConfig = MismatchConfig()
    grad_clip: float | None = pydantic.Field(1.0, gt=0,
                                             description="clip the global grad norm; null: off")
    micro_batch_tokens: int = pydantic.Field(
        8192, ge=1, description="padded tokens (sequences × longest) per forward/backward; "
                                "gradients accumulate over micro-batches with the batch's "
                                "global token counts as normaliser")
    skip_zero_advantage_groups: bool = pydantic.Field(
        True, description="drop groups whose advantages are all zero before the forward "
                          "(their policy-loss gradient is exactly zero); kept when a KL or "
                          "entropy term would give them a gradient")
    max_steps: int | None = pydantic.Field(
        None, ge=0, description="stop when the version reaches this (a restarted trainer "
                                "finishes the same total); null: run until stopped")
    publish_every: int = pydantic.Field(1, ge=1, description="publish weights every k steps")
    publish_initial: bool = pydantic.Field(
        False, description="a fresh trainer publishes version 0 (the initial weights) first")
    checkpoint_every: int = pydantic.Field(
        50, ge=1, description="checkpoint (and only then commit offsets) every N steps")
    keep_checkpoints: int = pydantic.Field(2, ge=1, description="newest checkpoints kept")
    checkpoint_dir: str = pydantic.Field(
        "{out}/checkpoints/trainer-{policy}",
        description="where checkpoints live ({out}: run dir, {policy})")
    on_missing_checkpoint: Literal["error", "committed"] = pydantic.Field(
        "error", description="no checkpoint but the group has committed offsets: error "
                             "(the checkpoint is the source of truth), or start fresh "
                             "weights from the committed offsets")
    device: Literal["auto", "cpu", "cuda"] = pydantic.Field(
        "auto", description="auto: cuda when available, else cpu")
    parallel: Literal["ddp", "fsdp"] = pydantic.Field(
        "ddp", description="with several ranks: ddp replicates the model on every rank and "
                           "sums gradients; fsdp shards weights, gradients and optimizer "
                           "state over the ranks (FSDP2, see trainer.fsdp)")
    fsdp: FsdpConfig = FsdpConfig()
    mixed_precision: Literal["no", "bf16", "fp16", "auto"] = pydantic.Field(
        "no", description="autocast compute dtype; master weights stay fp32. auto: bf16 where "
                          "the device computes it natively (a CUDA GPU with bf16, a CPU with "
                          "avx512_bf16 or amx_bf16), else no (fp32): a CPU without bf16 "
                          "instructions emulates it many times slower than fp32")
    seed: int = pydantic.Field(0, description="torch / numpy / python seed")
    deterministic: bool = pydantic.Field(
        False, description="torch.use_deterministic_algorithms(True) (bit-identical resume "
                           "on CPU; slower on GPU)")
    threads: int | None = pydantic.Field(None, ge=1,
                                         description="torch CPU threads; null: torch's default")
    log_jsonl: bool = pydantic.Field(True,
                                     description="one JSON line per step in "
                                                 "{out}/trainer-<policy>.jsonl")
    metrics_interval_s: float = pydantic.Field(2.0, gt=0,
                                               description="metrics topic emission interval")
    poll_timeout_s: float = pydantic.Field(0.5, gt=0, description="longest single bus poll")
    session_timeout_s: float = pydantic.Field(10.0, gt=0,
                                              description="consumer-group session timeout")
    dedup_window: int = pydantic.Field(10_000, ge=1,
                                       description="recent batch ids remembered (and "
                                                   "checkpointed) to drop duplicates")
    max_batch_tries: int = pydantic.Field(
        2, ge=1, description="tries of a batch whose step raises (or kills the process) "
                             "before it is quarantined: dead-lettered with the error, and "
                             "training goes on with the next batch (single-process trainers)")

    def checkpoint_root(self, out: str | Path, policy: str) -> Path:
        """Where ``policy``'s trainer keeps its checkpoints in run directory ``out``
        (``checkpoint_dir`` filled in): the trainer writes there, `astraflow run` exports the
        newest from there."""
        from astraflow.core.paths import expand

        return Path(expand(self.checkpoint_dir, out=out, policy=policy))

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> TrainerConfig:
        problems = []
        loss = self.loss
        if loss.kl != "none" and loss.kl_coef == 0:
            problems.append(f"loss.kl={loss.kl} with loss.kl_coef=0 computes a reference "
                            "forward for nothing; set kl_coef > 0 or kl: none")
        if loss.kl == "none" and loss.kl_coef > 0:
            problems.append(f"loss.kl_coef={loss.kl_coef} with loss.kl=none has no effect; "
                            "choose kl: k1 or k3")
        if loss.norm_length is not None and loss.aggregation != "seq-mean-token-sum-norm":
            problems.append("loss.norm_length only applies to aggregation "
                            "seq-mean-token-sum-norm")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base``: mappings merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in override.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = deep_merge(below, value)
        else:
            out[key] = value
    return out


def with_overrides(base: TrainerConfig, override: Mapping[str, Any]) -> TrainerConfig:
    """The trainer section of one policy: ``override`` (a partial ``trainer`` section, e.g.
    ``{"optimizer": {"lr": 1e-5}}``) deep-merged over ``base`` and validated as a whole
    section, so a merge that breaks a cross-field rule is refused like a bad ``trainer``.
    Raises :class:`pydantic.ValidationError` with locations inside the section."""
    return TrainerConfig.model_validate(deep_merge(base.model_dump(), override))
