"""A synchronous single-process GRPO loop (sample a batch with HF generate, then one trainer
step, alternating) on a run's warm model: the baseline `astraflow run` is compared against
in bench/quickstart.py, and a check of the RL recipe without any bus or process in between.

    python bench/sync_loop.py runs/quickstart                  # after scripts/quickstart.sh
    python bench/sync_loop.py runs/quickstart --seconds 300 --every 25 --threshold 0.4

It uses the run's config-rl.yaml (trainer section, reward, producer split, group size, batch
size) and its models/<policy>-warm directory. All prompts of a step are sampled in one
left-padded ``generate`` call; the step is the trainer's own ``rl_step``. Held-out greedy
accuracy is measured every --every steps on the same problems the run's evaluator uses; the
clock excludes evaluation (the run's evaluator is a separate process), so the baseline is
not charged for it.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from astraflow.config import load_experiment
from astraflow.consumers.evaluator import greedy_accuracy, held_out
from astraflow.consumers.rollout.rewards import build_reward
from astraflow.consumers.trainer.build import build_engine
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.records import Batch, Group, Trajectory, pack_f32, pack_i32, pack_u8
from astraflow.models.prompt import render_prompt
from astraflow.models.tiny import load
from astraflow.producers.arithmetic import arithmetic


def sample_groups(model: Any, tok: Any, specs: list[Any], *, n: int, temperature: float,
                  max_new_tokens: int, reward: Any, step: int) -> list[Group]:
    """``n`` sampled completions of every spec in one batched generate call, as groups."""
    pad, eos = tok.pad_token_id, tok.eos_token_id
    prompts = [render_prompt(tok, s.prompt)[1] for s in specs]
    width = max(len(p) for p in prompts)
    rows = [[pad] * (width - len(p)) + p for p in prompts for _ in range(n)]
    ids = torch.tensor(rows)
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=(ids != pad).long(), do_sample=True,
                             temperature=temperature, top_k=0, max_new_tokens=max_new_tokens,
                             pad_token_id=pad, eos_token_id=eos, output_scores=True,
                             return_dict_in_generate=True)
    logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
    groups = []
    for g, spec in enumerate(specs):
        prompt, k, trajs = prompts[g], len(prompts[g]), []
        for j in range(n):
            i = g * n + j
            gen = out.sequences[i, width:].tolist()
            gen = gen[:gen.index(eos) + 1] if eos in gen else [t for t in gen if t != pad]
            lp = [float(logps[i, pos, t]) for pos, t in enumerate(gen)]
            r = float(reward(tok.decode(gen, skip_special_tokens=True), spec.reference))
            trajs.append(Trajectory(
                id=f"{step}/{spec.id}/{j}", task_id=spec.id, group_id=f"{step}/{spec.id}",
                sample_index=j, group_size=n, token_ids=pack_i32(prompt + gen),
                loss_mask=pack_u8([0] * k + [1] * len(gen)), logprobs=pack_f32([0.0] * k + lp),
                versions=pack_i32([-1] * k + [step] * len(gen)), prompt_len=k, reward=r))
        groups.append(Group(group_id=f"{step}/{spec.id}", task_id=spec.id, trajectories=trajs))
    return groups


def run_sync(run_dir: Path, *, policy: str = "default", seconds: float = 300.0,
             max_steps: int | None = None, every: int = 25, threshold: float | None = None,
             threads: int = 2, seed: int | None = None,
             log: Any = print) -> list[dict[str, float]]:
    """The loop; returns the evaluation points ``{step, time, eval_accuracy}`` (time in
    training seconds, evaluation excluded). Stops at ``seconds``, ``max_steps`` or when
    the accuracy reaches ``threshold``. ``seed``: of the problems drawn and the sampling
    (default: the run's seed), so that repeats draw different learning curves."""
    torch.set_num_threads(threads)
    cfg = load_experiment(run_dir / "config-rl.yaml")
    mdir = run_dir / "models" / f"{policy}-warm"
    engine = build_engine(cfg.trainer, mdir)  # seeds torch with the trainer's seed
    seed = cfg.seed if seed is None else seed
    torch.manual_seed(seed)
    model = engine.model
    _, tok = load(mdir)
    reward = build_reward(cfg.rollout.reward)
    test = held_out(cfg.producer, cfg.launch.eval_problems)
    train = [s for s, _ in arithmetic(cfg.producer.arithmetic)]
    rng = random.Random(seed)
    engine_cfg = cfg.rollout.engine

    def point(step: int, clock: float) -> dict[str, float]:
        model.eval()
        acc = greedy_accuracy(model, tok, test, lambda t, r: reward(t, r),
                              max_new_tokens=engine_cfg.max_new_tokens)
        log(f"step {step} time {clock:.1f}s accuracy {acc:.3f}")
        return {"step": step, "time": clock, "eval_accuracy": acc}

    curve = [point(0, 0.0)]
    clock, step = 0.0, 0
    while clock < seconds and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        specs = rng.sample(train, cfg.data.batch_size)
        groups = sample_groups(model, tok, specs, n=cfg.producer.n_samples,
                               temperature=engine_cfg.temperature,
                               max_new_tokens=engine_cfg.max_new_tokens, reward=reward,
                               step=step)
        rl_step(engine, Batch(id=str(step), policy=policy, seq=step, groups=groups), step)
        step += 1
        clock += time.perf_counter() - t0
        if step % every == 0:
            curve.append(point(step, clock))
            if threshold is not None and curve[-1]["eval_accuracy"] >= threshold:
                break
    if step % every:
        curve.append(point(step, clock))
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--seconds", type=float, default=300.0, help="training seconds")
    ap.add_argument("--steps", type=int, default=None, help="at most this many steps")
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--threshold", type=float, default=None,
                    help="stop once held-out accuracy reaches this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None, help="default: the run's seed")
    ap.add_argument("--json", type=Path, default=None, help="write the curve here")
    args = ap.parse_args()
    curve = run_sync(args.run_dir, policy=args.policy, seconds=args.seconds,
                     max_steps=args.steps, every=args.every, threshold=args.threshold,
                     threads=args.threads, seed=args.seed,
                     log=lambda s: print(s, flush=True))
    if args.json:
        args.json.write_text(json.dumps(curve, indent=1))


if __name__ == "__main__":
    main()
