"""Where a model starts on a few reasoning-gym tasks: held-out greedy accuracy, sampled
accuracy (what RL's train reward estimates) and pass@k, through the evaluator's own code
(the task's held-out split, the chat template, the reward with its answer extraction). RL
climbs from a task whose sampled accuracy is neither ~0 (no group has a right answer to learn
from) nor ~1; this is how examples/smollm2_chain_sum.yaml's task was chosen.

    python -m bench.task_starts                       # SmolLM2-135M-Instruct, the tasks below
    python -m bench.task_starts --problems 32 --only chain_sum syllogism
    python -m bench.task_starts --model /path/to/hf-folder --max-new-tokens 32

One invocation is one sample of each task's held-out problems (seeded): say so when quoting.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

#: name: (reasoning-gym dataset, its config, answer extractor, what the prompt adds)
TASKS: dict[str, tuple[str, dict[str, Any], str]] = {
    "chain_sum": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                "max_digits": 1}, "last_number"),
    "chain_sum_2digit": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                       "max_digits": 2}, "last_number"),
    "basic_arithmetic": ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                              "max_digits": 1}, "last_number"),
    "syllogism": ("syllogism", {}, "first_word"),
    "leg_counting": ("leg_counting", {"min_animals": 1, "max_animals": 2}, "last_number"),
}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.task_starts",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="a models.<policy>.path: folder, .gguf, hub id or shortcut")
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(TASKS))
    ap.add_argument("--problems", type=int, default=64, help="held-out problems per task")
    ap.add_argument("--k", type=int, default=4, help="sampled completions per problem")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from astraflow.config import load_experiment
    from astraflow.consumers.evaluator import greedy_accuracy, held_out, sampled_accuracy
    from astraflow.consumers.rollout.rewards import build_reward
    from astraflow.models.source import resolve
    from astraflow.models.tiny import load

    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    model, tok = load(resolve(args.model))
    model.eval()
    print(f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
          f"parameters, loaded in {time.monotonic() - t0:.1f}s; {args.problems} held-out "
          f"problems a task, {args.max_new_tokens} new tokens, sampled at T=1", flush=True)
    print(f"| task | config | extract | greedy | sampled | pass@{args.k} | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only or list(TASKS):
        dataset, config, extract = TASKS[name]
        cfg = load_experiment(None, [
            "producer.source=reasoning_gym", f"producer.reasoning_gym.dataset={dataset}",
            f"producer.reasoning_gym.test_size={args.problems}",
            "rollout.reward.name=reasoning_gym", f"rollout.reward.extract={extract}",
            *(f"producer.reasoning_gym.config.{k}={v}" for k, v in config.items())])
        specs = held_out(cfg.producer, args.problems)
        reward = build_reward(cfg.rollout.reward)

        def score(text: str, ref: dict[str, Any], reward: Any = reward) -> float:
            return float(reward(text, ref))

        t = time.monotonic()
        greedy = greedy_accuracy(model, tok, specs, score, max_new_tokens=args.max_new_tokens)
        s = sampled_accuracy(model, tok, specs, score, k=args.k, temperature=1.0,
                             max_new_tokens=args.max_new_tokens, seed=0)
        shown = ", ".join(f"{k}={v}" for k, v in config.items()) or "defaults"
        print(f"| {name} ({len(specs)}) | {shown} | {extract} | {greedy:.3f} | "
              f"{s.accuracy:.3f} | {s.pass_at_k:.3f} | {time.monotonic() - t:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
