"""The trainer: GRPO-family RL and SFT as bus consumers (docs/trainer.md).

>>> trainer = build_trainer(config.trainer_for("solver"), config.model("solver"), run=config.run,
...                         policy="solver", out=out, bus=bus, publisher=publisher)
>>> trainer.run(max_steps=100)          # consume batches.solver, step, publish, checkpoint
>>> trainer.close()

The pure parts work without a bus: :func:`group_advantages`, :func:`policy_loss`,
:func:`prepare` / :func:`micro_batches`, :func:`rl_step` / :func:`sft_step` on an
:class:`TrainState`. Importing this package is light; the names below load torch on first use.

Modules:

- :mod:`.advantages`: Group-relative advantages (GRPO and Dr. GRPO).
- :mod:`.batching`: From a ``Batch`` record to padded micro-batches of tensors.
- :mod:`.build`: Factories: the ``trainer`` section → a :class:`TrainState` and a :class:`Trainer`.
- :mod:`.checkpoint`: Atomic trainer checkpoints: weights, optimizer, RNG, offsets.
- :mod:`.config`: Config section ``trainer``.
- :mod:`.dist`: Data parallelism across processes: one reader, the batch broadcast.
- :mod:`.loop`: The trainer as a bus consumer: batches in, optimizer steps, weights out.
- :mod:`.lora`: LoRA on the trainer (``trainer.lora``): train and publish the adapter.
- :mod:`.losses`: The GRPO-family policy loss, the SFT loss, and token logprobs.
- :mod:`.mismatch`: Train–inference mismatch of the engine's token logprobs.
- :mod:`.precision`: ``trainer.mixed_precision: auto``: bf16 where the hardware computes it natively.
- :mod:`.quarantine`: Poison batches: tried a bounded number of times, then dead-lettered.
- :mod:`.rl`: One RL optimizer step on one batch.
- :mod:`.sft`: One SFT optimizer step on a batch of demonstrations.
- :mod:`.sharded_checkpoint`: The tensors of a sharded (fsdp) checkpoint, through DCP.
- :mod:`.sharding`: FSDP2 for the trainer (``trainer.parallel: fsdp``).
- :mod:`.state`: The trainable state of one policy and the shared parts of a step.
- :mod:`.telemetry`: What the trainer reports: wait ratio, per-step lines, bus metrics.
"""

from __future__ import annotations

from astraflow.core.registry import lazy_exports

_EXPORTS = {
    "group_advantages": "advantages", "batch_advantages": "advantages",
    "LossSpec": "losses", "policy_loss": "losses", "sft_loss": "losses",
    "token_logprobs": "losses", "token_weights": "losses", "kl_penalty": "losses",
    "prepare": "batching", "micro_batches": "batching",
    "TrainState": "state", "rl_step": "rl", "sft_step": "sft",
    "CheckpointDir": "checkpoint", "CheckpointMeta": "checkpoint",
    "Trainer": "loop", "TrainStats": "loop", "TrainerError": "loop",
    "build_train_state": "build", "build_trainer": "build", "build_publisher": "build",
    "TrainerConfig": "config",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
