"""The trainer on the tiny model: step cost against a plain loop, the whole consumer on the
bus, and what the model learns.

    python -m bench.trainer            # about a minute on 2 cores
    python -m bench.trainer --quick    # fewer repeats
    python -m bench.trainer --parallel fsdp --ranks 2   # sharded vs 1 process (see
                                                        # bench/trainer_parallel.py)

1. **Step cost.** A quickstart-sized RL batch (64 prompts × 8 samples, 7 prompt + 4 completion
   tokens, half the groups with all-equal rewards) through :func:`rl_step`, with and without
   skipping zero-advantage groups, against a *plain loop* measured in the same run and
   interleaved with it: one forward of the whole padded batch, clipped token-mean GRPO loss,
   backward, AdamW — no micro-batching, no metrics, no skipping.
2. **On the bus.** The same batches produced to an embedded bus and consumed by the
   :class:`Trainer` with a weights publisher (bf16 snapshots + deltas to a file store) and a
   checkpoint every 10 steps: steps/s end to end, and the cost of one checkpoint.
3. **Learning.** SFT on one-digit sums (64 demonstrations a batch, lr 2e-3): the loss curve.
   RL on "emit 7" (reward: the share of the 4 sampled tokens that are '7'; 8 prompts × 8,
   lr 3e-3, batches sampled from the weights one version behind): the reward per step.

Prints markdown; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astraflow.config import ExperimentConfig
from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.checkpoint import CheckpointDir, CheckpointMeta
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.bus import embedded_url
from astraflow.core.records import Batch, Group
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_trainer
from astraflow.weights import FileStore, Publisher
from bench.lib.batches import TOK, produce, trajectory
from bench.lib.models import tiny_model


def quickstart_batch(seq: int, *, prompts: int = 64, group: int = 8, zero_share: float = 0.5
                     ) -> Batch:
    rng = np.random.default_rng(seq)
    groups = []
    for i in range(prompts):
        a, b = rng.integers(10, 100, size=2)
        prompt = TOK(f"{a}+{b}=").input_ids
        zero = i < prompts * zero_share
        trajs = []
        for k in range(group):
            completion = rng.integers(3, 17, size=4).tolist()
            reward = 0.0 if zero else float(rng.integers(0, 2))
            trajs.append(trajectory(prompt + completion, len(prompt), reward=reward,
                                    logprobs=(-rng.uniform(1, 4, size=4)).tolist(),
                                    version=seq, tid=f"{seq}-{i}-{k}", group_id=f"{seq}-{i}"))
        groups.append(Group(group_id=f"{seq}-{i}", task_id=str(i), trajectories=trajs))
    return Batch(id=f"default-{seq}", policy="default", seq=seq, groups=groups)


def plain_step(model: Any, opt: Any, batch: Batch) -> None:
    """The baseline: what a minimal single-process GRPO loop does per update."""
    from astraflow.consumers.trainer.batching import micro_batches, prepare

    (mb,) = micro_batches(prepare(batch), token_budget=10**9)
    logits = model(input_ids=mb.input_ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - mb.behav)
    adv = mb.adv  # per token
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    loss = (loss * mb.mask).sum() / mb.mask.sum()
    loss.backward()
    opt.step()
    opt.zero_grad()


def part1(model_dir: Path, repeats: int) -> None:
    batches = [quickstart_batch(s) for s in range(4)]
    states = {
        "ours, skip zero-advantage groups": build_train_state(
            TrainerConfig(device="cpu", micro_batch_tokens=16384), model_dir),
        "ours, no skipping": build_train_state(
            TrainerConfig(device="cpu", micro_batch_tokens=16384,
                          skip_zero_advantage_groups=False), model_dir),
    }
    plain = copy.deepcopy(states["ours, no skipping"].model)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=3e-4)
    times: dict[str, list[float]] = {"plain loop": [], **{k: [] for k in states}}
    for r in range(repeats):  # interleaved, so slow stretches of the machine hit all alike
        for b in batches:
            t = time.perf_counter()
            plain_step(plain, plain_opt, b)
            times["plain loop"].append(time.perf_counter() - t)
            for name, e in states.items():
                t = time.perf_counter()
                rl_step(e, b, r)
                times[name].append(time.perf_counter() - t)
    base = statistics.median(times["plain loop"])
    print("\n### 1. Step cost: 64 prompts × 8 samples, half the groups zero-advantage\n")
    print("| step | median ms | steps/s | × plain loop |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m * 1e3:.1f} | {1 / m:.1f} | {m / base:.2f} |")


def part2(model_dir: Path, steps: int, tmp: Path) -> None:
    cfg = ExperimentConfig.model_validate({
        "run": "bench", "bus": {"url": embedded_url(Path(tmp) / "bus.db")},
        "models": {"default": {"path": str(model_dir)}},
        "trainer": {"checkpoint_every": 10, "max_steps": steps, "poll_timeout_s": 0.05,
                    "micro_batch_tokens": 16384}})
    bus = open_bus(cfg, tmp)
    produce(bus, cfg.run, [quickstart_batch(s) for s in range(steps)])
    publisher = Publisher(bus, run=cfg.run, policy="default", store=FileStore(tmp / "w"))
    trainer = configured_trainer(cfg, "default", tmp, bus=bus, publisher=publisher)
    trainer.setup()
    t = time.perf_counter()
    stats = trainer.run(timeout=600)
    elapsed = time.perf_counter() - t
    trainer.close()
    publisher.close()
    ck = CheckpointDir(tmp / "ck", run="bench", policy="default")
    t = time.perf_counter()
    ck.save(trainer.state.model, trainer.state.optimizer, CheckpointMeta(version=1))
    ck_s = time.perf_counter() - t
    print(f"\n### 2. On the bus ({steps} batches, publish every step, checkpoint every 10)\n")
    print(f"- {stats.steps / elapsed:.1f} steps/s end to end ({elapsed / stats.steps * 1e3:.0f}"
          f" ms/step; busy {stats.busy_s:.1f} s, waiting {stats.wait_s:.2f} s)")
    print(f"- publisher: {publisher.stats.versions} versions ({publisher.stats.fulls} full, "
          f"{publisher.stats.deltas} delta, {publisher.stats.coalesced} coalesced), "
          f"{publisher.stats.bytes_written / 1e6:.2f} MB written")
    print(f"- one checkpoint (0.53M params + AdamW state, fsynced): {ck_s * 1e3:.0f} ms")
    bus.close()


def part3(model_dir: Path, tmp: Path) -> None:
    from bench.lib.batches import SEVEN, sample, sft_batch

    e = build_train_state(TrainerConfig(device="cpu", mode="sft", optimizer={"lr": 2e-3}),
                     model_dir)
    from astraflow.consumers.trainer.sft import sft_step

    losses = [sft_step(e, sft_batch(s), s)["loss"] for s in range(60)]
    print("\n### 3. Learning\n")
    print("SFT, one-digit sums, 64 demonstrations/batch, lr 2e-3 — loss (mean token NLL of "
          "the answer + <eos>) at steps " + ", ".join(
              f"{i + 1}: {losses[i]:.2f}" for i in (0, 9, 19, 29, 39, 59)))
    e = build_train_state(TrainerConfig(device="cpu", optimizer={"lr": 3e-3}), model_dir)
    behaviour = copy.deepcopy(e.model)
    gen = torch.Generator().manual_seed(0)
    rewards = []
    for step in range(20):
        rng = np.random.default_rng(step)
        prompts = [TOK(f"{a}+{b}=").input_ids for a, b in rng.integers(0, 10, (8, 2))]
        plen = len(prompts[0])
        ids, lps = sample(behaviour, prompts, 8, 4, gen)
        r = (ids[:, plen:] == SEVEN).float().mean(1)
        rewards.append(float(r.mean()))
        groups = [Group(group_id=f"{step}-{i}", task_id=str(i), trajectories=[
            trajectory(ids[i * 8 + k].tolist(), plen, reward=float(r[i * 8 + k]),
                       logprobs=lps[i * 8 + k].tolist(), version=max(step - 1, 0),
                       tid=f"{step}-{i}-{k}", group_id=f"{step}-{i}") for k in range(8)])
            for i in range(8)]
        behaviour.load_state_dict(e.model.state_dict())
        rl_step(e, Batch(id=str(step), policy="default", seq=step, groups=groups), step)
    print("\nRL, reward = share of '7' in 4 sampled tokens, 8×8 per batch, lr 3e-3, one "
          "version stale — mean reward per step: " + " ".join(f"{x:.2f}" for x in rewards))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.trainer")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"],
                    help="compare N ranks of this kind with one process instead")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (--parallel)")
    ap.add_argument("--hidden", type=int, default=256, help="model width (--parallel)")
    ap.add_argument("--layers", type=int, default=4, help="model depth (--parallel)")
    args = ap.parse_args()
    if args.parallel:
        from bench.trainer_parallel import compare

        compare(args.parallel, args.ranks, steps=args.steps, hidden=args.hidden,
                layers=args.layers)
        return
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model_dir = tiny_model(tmp, name="model")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        part1(model_dir, 2 if args.quick else 5)
        part2(model_dir, 20 if args.quick else 50, tmp)
        part3(model_dir, tmp)


if __name__ == "__main__":
    main()
