"""The checks of a warm-up to a target band (:mod:`astraflow.run.warmup`): where a policy
stands against the band (:class:`BandWatch`, pure), measuring a checkpoint's held-out accuracy
(:class:`HeldOutProbe`) and finding the trainer's new checkpoints, each pinned so its pruning
cannot take it while it is measured (:class:`CheckpointWatch`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astraflow.config import ExperimentConfig
from astraflow.core.errors import ConfigError
from astraflow.run.resources import model_dir

# --------------------------------------------------------------------------- band logic

@dataclass(frozen=True)
class Check:
    """One held-out measurement of a warm-up checkpoint (step 0: the model before SFT)."""

    step: int
    accuracy: float
    seconds: float = 0.0  # spent measuring
    time: float = 0.0  # when (seconds since the epoch)


def distance(accuracy: float, band: tuple[float, float]) -> float:
    """How far ``accuracy`` is outside ``band`` (0 inside it, edges included)."""
    low, high = band
    return max(0.0, low - accuracy, accuracy - high)


@dataclass
class BandWatch:
    """The checks of one policy's warm-up against the target band, in step order.

    Pure (no model, no bus): :meth:`add` a check, read :attr:`landed` (the first check inside
    the band), :attr:`closest` (nearest the band; the earliest of equals) and :attr:`jumps`
    (consecutive checks that stepped over the whole band, which says ``check_every`` is too
    coarse for this trajectory)."""

    band: tuple[float, float]
    checks: list[Check] = field(default_factory=list)
    landed: Check | None = None
    closest: Check | None = None
    jumps: list[tuple[Check, Check]] = field(default_factory=list)

    def add(self, check: Check) -> bool:
        """Record ``check``; True when it is the first one inside the band."""
        low, high = self.band
        prev = self.checks[-1] if self.checks else None
        self.checks.append(check)
        if prev is not None and self.landed is None and (
                (prev.accuracy < low and check.accuracy > high)
                or (prev.accuracy > high and check.accuracy < low)):
            self.jumps.append((prev, check))
        if self.closest is None or (distance(check.accuracy, self.band)
                                    < distance(self.closest.accuracy, self.band)):
            self.closest = check
        if self.landed is None and distance(check.accuracy, self.band) == 0.0:
            self.landed = check
            return True
        return False

    def outcome(self, on_miss: str) -> tuple[str, Check | None]:
        """Once the checks are over: ``("in_band", landed)``, ``("closest", nearest)`` when
        ``on_miss`` is ``closest``, else ``("missed", None)``."""
        if self.landed is not None:
            return "in_band", self.landed
        if on_miss == "closest" and self.closest is not None:
            return "closest", self.closest
        return "missed", None

    def describe_miss(self) -> str:
        """Why no check landed, and what to change."""
        low, high = self.band
        if not self.checks:
            return "no checkpoint was measured"
        best = self.closest
        assert best is not None
        text = (f"no check of {len(self.checks)} was inside [{low}, {high}]; the nearest was "
                f"{best.accuracy:.3f} at step {best.step}")
        if self.jumps:
            a, b = self.jumps[0]
            text += (f"; accuracy jumped over the band between step {a.step} ({a.accuracy:.3f})"
                     f" and step {b.step} ({b.accuracy:.3f}): lower launch.warmup.check_every")
        elif best.accuracy < low:
            text += ": raise launch.warmup.steps (the cap) or launch.warmup.lr"
        else:
            text += ": the model is above the band before it is checked; lower " \
                    "launch.warmup.check_every or widen launch.warmup.target_accuracy"
        return text


# --------------------------------------------------------------------- measuring a checkpoint

class HeldOutProbe:
    """Held-out greedy accuracy of weight files for one policy, in this process: the
    evaluator's problems, reward and kind (:func:`astraflow.run.roles.evaluation_kind`). For
    the policy playing a team's ``verifier`` role: balanced judgement accuracy on the held-out
    problems' claims (right and wrong, half each; the mean of the two halves' accuracies); for
    a multi-turn workflow's: its greedy episodes (tool calls, then the answer)."""

    def __init__(self, config: ExperimentConfig, policy: str, out: Path) -> None:
        import torch

        from astraflow.consumers.evaluator import held_out
        from astraflow.consumers.rollout.rewards import build_reward
        from astraflow.consumers.rollout.rewards.sandbox import configure
        from astraflow.models.tiny import load

        if config.launch.threads_per_role is not None:
            # this process shares the cores with the trainer it is measuring
            torch.set_num_threads(config.launch.threads_per_role)
        try:
            self.specs = held_out(config.producer, config.launch.eval_problems, out)
        except ConfigError as e:
            raise ConfigError(f"launch.warmup.target_accuracy: {e}; or set target_accuracy: "
                              "null for a warm-up of exactly `steps` steps") from None
        self.model, self.tokenizer = load(model_dir(config, policy, out))
        self.model.eval()
        configure(allow_same_uid=config.rollout.sandbox.allow_same_uid)  # as the workers do
        self.reward = build_reward(config.rollout.reward)
        self.max_new_tokens = config.rollout.engine.max_new_tokens
        self.claims: list[Any] | None = None
        from astraflow.run.roles import evaluation_kind

        self.kind = evaluation_kind(config, policy)
        self.policy, self.config = policy, config
        if self.kind == "verdict":
            from astraflow.consumers.evaluator import held_out_claims
            from astraflow.run.roles import verifier_turn

            prompt, self.max_new_tokens = verifier_turn(config)
            self.claims = held_out_claims(config.producer, config.launch.eval_problems, out=out,
                                          prompt=prompt, seed=config.seed)

    def measure(self, weights: Path | None = None) -> float:
        """Accuracy of ``weights`` (a ``model.safetensors`` of the same architecture), or of
        the model as loaded when None; a verifier's: its evaluator's balanced judgement."""
        from safetensors.torch import load_file

        from astraflow.consumers.evaluator import greedy_accuracy, greedy_verdicts

        if weights is not None:
            self.model.load_state_dict(load_file(str(weights)), strict=True)
        if self.claims is not None:
            return greedy_verdicts(self.model, self.tokenizer, self.claims,
                                   max_new_tokens=self.max_new_tokens).balanced
        if self.kind == "episode":
            from astraflow.consumers.evaluator import greedy_episode_accuracy

            c = self.config
            return greedy_episode_accuracy(
                self.model, self.tokenizer, self.specs, policy=self.policy,
                workflow=c.workflow(), workflow_kwargs=c.workflow_kwargs(),
                reward=c.rollout.reward, max_new_tokens=self.max_new_tokens,
                temperature=c.launch.eval_temperature)
        return greedy_accuracy(self.model, self.tokenizer, self.specs,
                               lambda text, ref: float(self.reward(text, ref)),
                               max_new_tokens=self.max_new_tokens)


class CheckpointWatch:
    """New checkpoints of one warm-up trainer, each pinned (its ``model.safetensors``
    hard-linked aside, so the trainer's pruning cannot take it while it is measured)."""

    def __init__(self, root: Path, keep: Path, every: int) -> None:
        self.root = root
        self.keep = keep
        self.every = every
        self.seen = 0  # step 0 is the model as built, measured before the trainer starts
        self.missed: list[int] = []  # checkpoint steps pruned before they could be pinned

    def new(self) -> list[tuple[int, Path]]:
        """(step, pinned weights) of every checkpoint newer than the last one returned."""
        if not self.root.is_dir():
            return []
        steps = sorted(int(p.name.removeprefix("step-")) for p in self.root.glob("step-*")
                       if p.is_dir() and p.name.removeprefix("step-").isdigit())
        found = []
        for step in steps:
            if step <= self.seen:
                continue
            # the trainer checkpoints at every multiple of `every` (and where it stops)
            self.missed += range((self.seen // self.every + 1) * self.every, step, self.every)
            self.seen = step
            pinned = self.keep / f"step-{step:010d}"
            try:
                pinned.mkdir(parents=True, exist_ok=True)
                _link(self.root / f"step-{step:010d}" / "model.safetensors",
                      pinned / "model.safetensors")
            except FileNotFoundError:  # pruned between the listing and the link
                shutil.rmtree(pinned, ignore_errors=True)
                self.missed.append(step)
                continue
            found.append((step, pinned))
        return found


def _link(src: Path, dst: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        shutil.copy2(src, dst)  # another filesystem: copy
