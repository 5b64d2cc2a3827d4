"""The trainer: GRPO-family RL and SFT as bus consumers (docs/trainer.md).

>>> trainer = build_trainer(config, "solver", out, bus=bus, publisher=publisher)
>>> trainer.run(max_steps=100)          # consume batches.solver, step, publish, checkpoint
>>> trainer.close()

The pure parts work without a bus: :func:`group_advantages`, :func:`policy_loss`,
:func:`prepare` / :func:`micro_batches`, :func:`rl_step` / :func:`sft_step` on an
:class:`Engine`. Importing this package is light (the config section is read by every
command); the names below load torch on first use.
"""

from __future__ import annotations

from astraflow.core.registry import lazy_exports

_EXPORTS = {
    "group_advantages": "advantages", "batch_advantages": "advantages",
    "LossSpec": "losses", "policy_loss": "losses", "sft_loss": "losses",
    "token_logprobs": "losses", "token_weights": "losses", "kl_penalty": "losses",
    "prepare": "batching", "micro_batches": "batching",
    "Engine": "engine", "rl_step": "rl", "sft_step": "sft",
    "CheckpointDir": "checkpoint", "TrainerState": "checkpoint",
    "Trainer": "loop", "TrainStats": "loop", "TrainerError": "loop",
    "build_engine": "build", "build_trainer": "build", "build_publisher": "build",
    "TrainerConfig": "config",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
