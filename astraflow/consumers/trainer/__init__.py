"""The trainer: GRPO-family RL and SFT as bus consumers (docs/trainer.md).

>>> trainer = build_trainer(config.trainer_for("solver"), config.model("solver"), run=config.run,
...                         policy="solver", out=out, bus=bus, publisher=publisher)
>>> trainer.run(max_steps=100)          # consume batches.solver, step, publish, checkpoint
>>> trainer.close()

The pure parts work without a bus: :func:`group_advantages`, :func:`policy_loss`,
:func:`prepare` / :func:`micro_batches`, :func:`rl_step` / :func:`sft_step` on an
:class:`TrainState`. Importing this package is light (the config section is read by every
command); the names below load torch on first use.

Modules:

- :mod:`.advantages`: Group-relative advantages (GRPO and Dr.
- :mod:`.batching`: From a :class:`~astraflow.core.records.Batch` record to padded micro-batches of
  tensors.
- :mod:`.build`: Factories: the ``trainer`` section (and the policy's ``models`` section) → an
  :class:`TrainState` and a :class:`Trainer`.
- :mod:`.checkpoint`: Atomic trainer checkpoints: weights, optimizer, RNG, version and consumed
  offsets.
- :mod:`.config`: Config section ``trainer``: mode, optimizer, loss switches, micro-batching,
  checkpoints.
- :mod:`.dist`: Data parallelism across processes (``accelerate launch`` / ``torchrun``): one
  reader.
- :mod:`.loop`: The trainer as a bus consumer: batches.<policy> in, optimizer steps, weights out.
- :mod:`.lora`: LoRA on the trainer (``trainer.lora``): wrap the model with peft, train and publish
  the adapter.
- :mod:`.losses`: The GRPO-family policy loss with every switch, the SFT loss, and token logprobs.
- :mod:`.mismatch`: Train–inference mismatch: how far the engine's token logprobs are from the
  trainer's.
- :mod:`.quarantine`: Poison batches: a batch that makes the trainer's step raise is tried a
  bounded number of times.
- :mod:`.rl`: One RL optimizer step on one batch: advantages, micro-batched loss, gradient, update.
- :mod:`.sft`: One SFT optimizer step: cross-entropy on the masked tokens of a batch of
  demonstrations.
- :mod:`.sharded_checkpoint`: The tensors of a sharded (fsdp) checkpoint, through
  ``torch.distributed.checkpoint`` (DCP).
- :mod:`.sharding`: FSDP2 for the trainer (``trainer.parallel: fsdp``): shard, reduce, clip,
  gather.
- :mod:`.state`: The trainable state of one policy and the parts of a step that RL and SFT share.
- :mod:`.telemetry`: What the trainer reports: the wait ratio, the per-step JSON lines, metrics on
  the bus.
"""

from __future__ import annotations

from astraflow.core.registry import lazy_exports

_EXPORTS = {
    "group_advantages": "advantages", "batch_advantages": "advantages",
    "LossSpec": "losses", "policy_loss": "losses", "sft_loss": "losses",
    "token_logprobs": "losses", "token_weights": "losses", "kl_penalty": "losses",
    "prepare": "batching", "micro_batches": "batching",
    "TrainState": "state", "rl_step": "rl", "sft_step": "sft",
    "CheckpointDir": "checkpoint", "TrainerState": "checkpoint",
    "Trainer": "loop", "TrainStats": "loop", "TrainerError": "loop",
    "build_train_state": "build", "build_trainer": "build", "build_publisher": "build",
    "TrainerConfig": "config",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
