"""A synchronous single-process GRPO loop (sample with HF generate, then one trainer step,
alternating) on a run's warm model: the baseline `astraflow run` is compared against, and a
check of the RL recipe without any bus or process in between.

    python bench/sync_loop.py runs/quickstart            # after scripts/quickstart.sh
    python bench/sync_loop.py runs/quickstart --steps 300 --prompts 64 --every 50

It uses the run's config-rl.yaml (trainer section, reward, producer split) and its
models/<policy>-warm directory, and prints held-out greedy accuracy every --every steps.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from astraflow.config import load_experiment
from astraflow.consumers.evaluator import greedy_accuracy, held_out
from astraflow.consumers.rollout.context import render_prompt
from astraflow.consumers.rollout.rewards import build_reward
from astraflow.consumers.trainer.build import build_engine
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.records import Batch, Group, Trajectory, pack_f32, pack_i32, pack_u8
from astraflow.models.tiny import load
from astraflow.producers.arithmetic import arithmetic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_experiment(args.run_dir / "config-rl.yaml")
    mdir = args.run_dir / "models" / f"{args.policy}-warm"
    engine = build_engine(cfg.trainer, mdir)
    model = engine.model
    _, tok = load(mdir)
    reward = build_reward(cfg.rollout.reward)
    test = held_out(cfg, cfg.launch.eval_problems)
    train = [s for s, _ in arithmetic(cfg.producer.arithmetic)]
    n = cfg.producer.n_samples
    new = cfg.rollout.engine.max_new_tokens
    temp = cfg.rollout.engine.temperature
    rng = random.Random(cfg.seed)

    def accuracy() -> float:
        model.eval()
        a = greedy_accuracy(model, tok, test, lambda t, r: reward(t, r), max_new_tokens=new)
        model.train()
        return a

    print(f"step 0 accuracy {accuracy():.3f}", flush=True)
    t0 = time.monotonic()
    for step in range(args.steps):
        groups = []
        for spec in rng.sample(train, args.prompts):
            prompt = render_prompt(tok, spec.prompt)[1]
            ids = torch.tensor([prompt] * n)
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     do_sample=True, temperature=temp, top_k=0,
                                     max_new_tokens=new, pad_token_id=tok.pad_token_id,
                                     eos_token_id=tok.eos_token_id, output_scores=True,
                                     return_dict_in_generate=True)
            logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
            trajs = []
            for i in range(n):
                gen = out.sequences[i, len(prompt):].tolist()
                gen = (gen[:gen.index(tok.eos_token_id) + 1] if tok.eos_token_id in gen
                       else [g for g in gen if g != tok.pad_token_id])
                lp = [float(logps[i, j, g]) for j, g in enumerate(gen)]
                r = float(reward(tok.decode(gen, skip_special_tokens=True), spec.reference))
                k = len(prompt)
                trajs.append(Trajectory(
                    id=f"{step}/{spec.id}/{i}", task_id=spec.id, group_id=f"{step}/{spec.id}",
                    sample_index=i, group_size=n, token_ids=pack_i32(prompt + gen),
                    loss_mask=pack_u8([0] * k + [1] * len(gen)),
                    logprobs=pack_f32([0.0] * k + lp),
                    versions=pack_i32([-1] * k + [step] * len(gen)), prompt_len=k, reward=r))
            groups.append(Group(group_id=f"{step}/{spec.id}", task_id=spec.id,
                                trajectories=trajs))
        m = rl_step(engine, Batch(id=str(step), policy=args.policy, seq=step, groups=groups),
                    step)
        if (step + 1) % args.every == 0:
            print(f"step {step + 1} reward {m['reward_mean']:.3f} accuracy {accuracy():.3f} "
                  f"seconds {time.monotonic() - t0:.0f}", flush=True)


if __name__ == "__main__":
    main()
