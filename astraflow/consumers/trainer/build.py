"""Factories: the ``trainer`` section (and the policy's ``models`` section) → a
:class:`TrainState` and a :class:`Trainer`.

Configs reach the trainer's classes only through here; the experiment config never does
(:mod:`astraflow.run.roles` hands over the sections). ``accelerate`` places the model on the
device (CPU, one GPU, or one GPU per process under ``accelerate launch``) and provides autocast
for ``mixed_precision``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from astraflow.consumers.trainer.checkpoint import CheckpointDir
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.consumers.trainer.loop import StepFn, Trainer
from astraflow.consumers.trainer.losses import LossSpec
from astraflow.consumers.trainer.mismatch import Alarm
from astraflow.consumers.trainer.state import TrainState
from astraflow.core.bus.types import Bus
from astraflow.core.errors import ConfigError
from astraflow.core.records.checks import RecordLimits
from astraflow.models.config import ModelConfig, model_dir

if TYPE_CHECKING:
    from astraflow.core.claims import BlobStore
    from astraflow.weights.publisher import Publisher

log = logging.getLogger("astraflow.trainer")


def loss_spec(tc: TrainerConfig) -> LossSpec:
    lc = tc.loss
    return LossSpec(aggregation=lc.aggregation, eps_low=lc.eps_low, eps_high=lc.eps_high,
                    dual_clip=lc.dual_clip, kl=lc.kl, kl_coef=lc.kl_coef,
                    entropy_coef=lc.entropy_coef, decoupled=lc.decoupled,
                    behaviour_cap=lc.behaviour_cap, behaviour_cap_mode=lc.behaviour_cap_mode,
                    behaviour_level=lc.behaviour_level, norm_length=lc.norm_length)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _device_settings(tc: TrainerConfig) -> Any:
    from accelerate import Accelerator

    if tc.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device: cuda was asked for but torch sees no CUDA device; "
                          "use device: auto or cpu")
    if tc.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if tc.threads is not None:
        torch.set_num_threads(tc.threads)
    from astraflow.consumers.trainer.precision import on_cpu, resolve, slow_bf16

    # cpu=True also for "auto" without CUDA: under torchrun that is what makes accelerate
    # set up the gloo process group (MULTI_CPU) instead of a lone process per rank
    cpu = on_cpu(tc.device)
    # accelerate keeps one AcceleratorState per process and refuses another precision: a
    # second trainer in the process (another policy, a test) gets its own; the distributed
    # state (PartialState) is kept
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    slow = slow_bf16(tc.mixed_precision, cpu=cpu)
    if slow:
        log.warning(slow)
    return Accelerator(cpu=cpu, mixed_precision=resolve(tc.mixed_precision, cpu=cpu))


def load_model(path: str | Path, device: torch.device) -> tuple[torch.nn.Module, int]:
    """An HF causal LM from a local directory as fp32 master weights on ``device``, and its
    pad token id (0 when it has none)."""
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not (p / "config.json").exists():
        raise ConfigError(f"model directory {p} has no config.json; set models.<policy>.path "
                          "to a Hugging Face model directory or models.<policy>.build to a "
                          "tiny model")
    model: Any = AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32,
                                                      use_safetensors=True)
    model = model.to(device)
    pad = model.config.pad_token_id
    return model, int(pad) if pad is not None else 0


def vocab_size(model: torch.nn.Module) -> int | None:
    """Rows of ``model``'s input embedding: every token id it can embed is below this."""
    try:
        emb = model.get_input_embeddings()  # type: ignore[operator]
    except (AttributeError, NotImplementedError):
        return None
    n = getattr(emb, "num_embeddings", None)
    return int(n) if isinstance(n, int) else None


def build_train_state(tc: TrainerConfig, model_path: str | Path) -> TrainState:
    """Seed, pick the device, load the model (and the frozen reference for KL), make the
    optimizer."""
    seed_everything(tc.seed)
    accelerator = _device_settings(tc)
    device = accelerator.device
    model, pad_id = load_model(model_path, device)
    adapter = None
    if tc.lora is not None:  # before any sharding: peft wraps the whole model (trainer/lora.py)
        from astraflow.consumers.trainer import lora

        model = lora.wrap(model, tc.lora)
        adapter = lora.spec(model, model_path)
    if tc.parallel == "fsdp":  # before the optimizer: it must hold the shards
        from astraflow.consumers.trainer.sharding import shard_model

        shard_model(model, tc.fsdp, device)
    oc = tc.optimizer
    # LoRA: only the adapter requires a gradient, so only it gets AdamW state
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=oc.lr, betas=oc.betas,
                                  weight_decay=oc.weight_decay, eps=oc.eps)
    ref = None
    # LoRA's reference is its own base (the adapter switched off: state.reference); a full
    # model's is a frozen copy, sharded like the model under fsdp (1/N of it per rank)
    if tc.mode == "rl" and tc.loss.kl != "none" and adapter is None:
        ref, _ = load_model(model_path, device)
        ref.eval()
        ref.requires_grad_(False)
        if tc.parallel == "fsdp":
            from astraflow.consumers.trainer.sharding import shard_model

            shard_model(ref, tc.fsdp, device, frozen=True)
    return TrainState(
        model=model, optimizer=optimizer, device=device, mode=tc.mode, spec=loss_spec(tc),
        # SFT learns the model's own distribution: the sampling temperature is an RL matter
        temperature=tc.loss.temperature if tc.mode == "rl" else 1.0,
        token_budget=tc.micro_batch_tokens,
        grad_clip=tc.grad_clip, lr=oc.lr, warmup_steps=oc.warmup_steps,
        skip_zero=tc.skip_zero_advantage_groups, std_norm=tc.loss.std_norm,
        adv_eps=tc.loss.adv_eps, entropy_metric=tc.loss.entropy_metric, ref_model=ref,
        pad_id=pad_id, autocast=accelerator.autocast, rank=accelerator.process_index,
        world=accelerator.num_processes, parallel=tc.parallel, adapter=adapter,
        mismatch_threshold=tc.mismatch.token_threshold)


def step_function(mode: str) -> StepFn:
    if mode == "sft":
        from astraflow.consumers.trainer.sft import sft_step

        return sft_step
    from astraflow.consumers.trainer.rl import rl_step

    return rl_step


def build_trainer(tc: TrainerConfig, model: ModelConfig, *, run: str, policy: str,
                  out: str | Path = ".", bus: Bus, publisher: Publisher | None = None,
                  metrics: Any = None, claims: BlobStore | None = None,
                  limits: RecordLimits | None = None) -> Trainer:
    """A trainer of ``policy`` in run ``run`` as the ``trainer`` section ``tc`` describes,
    starting from the model that ``model`` names (built first when it asks for a tiny one);
    ``{out}`` in the paths is the run directory ``out``. ``limits``: what a batch's
    trajectories are checked against (``data.records``); the token ids' bound is always the
    loaded model's vocabulary."""
    state = build_train_state(tc, model_dir(model, policy, out))
    limits = limits or RecordLimits()
    vocab = vocab_size(state.model)
    if vocab is not None:
        limits = dataclasses.replace(limits, vocab={**limits.vocab, policy: vocab})
    if publisher is not None and state.adapter is not None:
        publisher.adapter = state.adapter  # manifests say: a LoRA adapter over this base
    checkpoints = CheckpointDir(tc.checkpoint_root(out, policy), run=run, policy=policy,
                                keep=tc.keep_checkpoints)
    log_path = Path(out).resolve() / f"trainer-{policy}.jsonl" if tc.log_jsonl else None
    cores = None
    if state.world == 1 and state.device.type == "cpu":
        # one machine's cores shared with the rollout workers (`astraflow run` on a CPU host):
        # the trainer lends its share while it waits for a batch and keeps its own threads
        # (steps bit-for-bit the same whoever else is busy: core/cores.py)
        from astraflow.core.cores import from_env

        cores = from_env(f"trainer-{policy}", borrow=False)
    return Trainer(
        bus=bus, run=run, policy=policy, state=state, step_fn=step_function(tc.mode),
        checkpoints=checkpoints, publisher=publisher, checkpoint_every=tc.checkpoint_every,
        publish_every=tc.publish_every, publish_initial=tc.publish_initial,
        max_version=tc.max_steps, session_timeout=tc.session_timeout_s,
        poll_timeout=tc.poll_timeout_s, dedup_window=tc.dedup_window,
        on_missing_checkpoint=tc.on_missing_checkpoint, log_path=log_path, metrics=metrics,
        claims=claims, cores=cores, limits=limits, max_batch_tries=tc.max_batch_tries,
        mismatch=Alarm.from_config(tc.mismatch) if tc.mode == "rl" else None)
