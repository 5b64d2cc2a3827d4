"""A synchronous single-process GRPO loop (sample a batch with HF generate, then one trainer
step, alternating) from the model a run's RL starts from: the baseline `astraflow run` is
compared against in bench/quickstart.py, and a check of the RL recipe without any bus or
process in between.

    python -m bench.sync_loop runs/quickstart                  # after scripts/quickstart.sh
    python -m bench.sync_loop runs/quickstart --seconds 300 --every 25 --threshold 0.4
    python -m bench.sync_loop examples/smollm2_chain_sum.yaml --seconds 900 --threshold 0.55

SOURCE is a run directory of `astraflow run` whose warm-up ended (its config-rl.yaml and the
models its RL phase started from: the warm-up's exports, or the models as configured), or an
experiment config without a warm-up (``launch.warmup.steps: 0``: RL starts from its
``models.<policy>`` as `astraflow run` resolves it, a gguf file or a shortcut included). The
config gives the trainer section, the reward (with its ``extract``), the sampling
(temperature, top_p, max_new_tokens), the producer's train split (the tasks it releases,
``system_prompt`` first), the group size and the batch size. All prompts of a step are
sampled in one left-padded ``generate`` call, stopping at every EOS id the rollout engine
stops at, by the model in the engine's dtype (``rollout.engine.dtype``: a copy of the
trainer's weights refreshed after every step, where it is not float32) and under bf16
autocast where the engine's ``mixed_precision`` is; the step is the trainer's own
``rl_step``. Held-out greedy accuracy is measured
every --every steps (default: the config's ``launch.eval_every``, the versions the run's
evaluator measures) on the problems the run's evaluator uses; the clock excludes evaluation
(the run's evaluator is a separate process), so the baseline is not charged for it.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.consumers.evaluator import greedy_accuracy, held_out
from astraflow.consumers.rollout.engines.sampling import eos_ids
from astraflow.consumers.rollout.rewards import build_reward
from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.errors import ConfigError
from astraflow.core.records import Batch, Group, Trajectory, pack_f32, pack_i32, pack_u8
from astraflow.models.load import load_tokenizer
from astraflow.models.prompt import render_prompt
from astraflow.producers import tasks
from astraflow.run.launch import RL_CONFIG
from astraflow.run.resources import model_dir

ROOT = Path(__file__).resolve().parents[1]


def start_point(source: Path, policy: str = "default",
                out: Path | None = None) -> tuple[ExperimentConfig, Path, Path]:
    """(config, model directory, run directory) RL starts from: ``source`` is a run
    directory whose warm-up ended, or a config without a warm-up (its model resolved with
    ``out`` as the run directory; default runs/sync-loop)."""
    if source.is_dir():
        from astraflow.run.warmup import start_models

        models = start_models(source)
        if policy not in models:
            raise ConfigError(f"{source}: no policy {policy!r}; valid: {', '.join(models)}")
        return load_experiment(source / RL_CONFIG), models[policy], source
    cfg = load_experiment(source)
    if cfg.launch.warmup.steps > 0:
        raise ConfigError(f"{source} warms up first (launch.warmup.steps="
                          f"{cfg.launch.warmup.steps}), and the loop starts where RL starts: "
                          f"give the directory of a run whose warm-up ended (`astraflow run "
                          f"{source} --warmup-only --out DIR`)")
    if policy not in cfg.policies:
        raise ConfigError(f"{source}: no policy {policy!r}; valid: {', '.join(cfg.policies)}")
    out = out or ROOT / "runs" / "sync-loop"
    return cfg, model_dir(cfg, policy, out), out


def serving_copy(model: Any, dtype: str) -> Any:
    """The model the loop samples from: ``model`` itself for ``rollout.engine.dtype``
    float32 (or auto), else a copy in that dtype (as the pipeline's engine serves it), which
    the loop refreshes after every step."""
    if dtype in ("float32", "auto"):
        return model
    import copy

    return copy.deepcopy(model).to(getattr(torch, dtype)).eval()


def sample_groups(model: Any, tok: Any, specs: list[Any], *, n: int, temperature: float,
                  max_new_tokens: int, reward: Any, step: int,
                  top_p: float = 1.0, autocast: bool = False) -> list[Group]:
    """``n`` sampled completions of every spec in one batched generate call, as groups."""
    pad = tok.pad_token_id
    # the rollout engine's stop set: an instruct model's end-of-turn ids too
    eos = eos_ids(tok, model.config, getattr(model, "generation_config", None))
    prompts = [render_prompt(tok, s.prompt)[1] for s in specs]
    width = max(len(p) for p in prompts)
    rows = [[pad] * (width - len(p)) + p for p in prompts for _ in range(n)]
    ids = torch.tensor(rows)
    # from the padding widths, not ids != pad: a pad that is also EOS (SmolLM2's <|im_end|>)
    # is in every chat-template prompt
    starts = torch.tensor([width - len(p) for p in prompts for _ in range(n)])
    att = (torch.arange(width)[None, :] >= starts[:, None]).long()
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model.generate(input_ids=ids, attention_mask=att, do_sample=True,
                             temperature=temperature, top_p=top_p, top_k=0,
                             max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=sorted(eos) or None, output_scores=True,
                             return_dict_in_generate=True)
    new = out.sequences[:, width:]
    # the logprob of each sampled token under the distribution it was sampled from (the
    # scores are the processed logits: temperature and top-p applied), one step at a time
    logps = torch.stack([torch.log_softmax(s.float(), -1).gather(-1, new[:, t:t + 1])[:, 0]
                         for t, s in enumerate(out.scores)], 1)
    groups = []
    for g, spec in enumerate(specs):
        prompt, k, trajs = prompts[g], len(prompts[g]), []
        for j in range(n):
            i = g * n + j
            gen = new[i].tolist()
            end = next((at for at, t in enumerate(gen) if t in eos), None)
            gen = gen if end is None else gen[:end + 1]  # the padding after EOS dropped
            lp = [float(logps[i, pos]) for pos in range(len(gen))]
            r = float(reward(tok.decode(gen, skip_special_tokens=True), spec.reference))
            trajs.append(Trajectory(
                id=f"{step}/{spec.id}/{j}", task_id=spec.id, group_id=f"{step}/{spec.id}",
                sample_index=j, group_size=n, token_ids=pack_i32(prompt + gen),
                loss_mask=pack_u8([0] * k + [1] * len(gen)), logprobs=pack_f32([0.0] * k + lp),
                versions=pack_i32([-1] * k + [step] * len(gen)), prompt_len=k, reward=r))
        groups.append(Group(group_id=f"{step}/{spec.id}", task_id=spec.id, trajectories=trajs))
    return groups


def run_sync(source: Path, *, policy: str = "default", seconds: float = 300.0,
             max_steps: int | None = None, every: int | None = None,
             threshold: float | None = None, threads: int = 2, seed: int | None = None,
             out: Path | None = None, log: Any = print,
             trainer: dict[str, Any] | None = None) -> list[dict[str, float]]:
    """The loop from ``source`` (:func:`start_point`); returns the evaluation points ``{step,
    time, sampling_s, eval_accuracy}`` (time in training seconds, evaluation excluded;
    sampling_s the part of it spent generating and scoring). Evaluates every
    ``every`` steps (default: the config's ``launch.eval_every``); stops at ``seconds``,
    ``max_steps`` or when the accuracy reaches ``threshold``. ``seed``: of the problems drawn
    and the sampling (default: the run's seed), so that repeats draw different learning
    curves. ``trainer``: a partial trainer section laid over the config's (bench/lora.py:
    ``{"lora": {...}}``)."""
    cfg, mdir, run_dir = start_point(source, policy, out)
    if trainer:
        from astraflow.consumers.trainer.config import with_overrides

        cfg = cfg.model_copy(update={"trainer": with_overrides(cfg.trainer, trainer)})
    every = every or cfg.launch.eval_every
    state = build_train_state(cfg.trainer, mdir)  # seeds torch with the trainer's seed
    torch.set_num_threads(threads)  # after: build_train_state applies trainer.threads (a role's)
    seed = cfg.seed if seed is None else seed
    torch.manual_seed(seed)
    model = state.model
    sampler = serving_copy(model, cfg.rollout.engine.dtype)
    tok = load_tokenizer(mdir)
    reward = build_reward(cfg.rollout.reward)
    test = held_out(cfg.producer, cfg.launch.eval_problems, run_dir)
    # one pass of what the producer releases (system_prompt first), as Task records
    train = list(tasks(cfg.producer.model_copy(update={"epochs": 1}), run_dir))
    rng = random.Random(seed)
    engine_cfg = cfg.rollout.engine
    log(f"model {mdir}, {len(train)} train tasks, {len(test)} held-out, batch "
        f"{cfg.data.batch_size} x {cfg.producer.n_samples}, evaluation every {every} steps")

    sampling_s = 0.0  # of the clock: generating and scoring (the rest is training)

    def point(step: int, clock: float) -> dict[str, float]:
        model.eval()
        t0 = time.perf_counter()
        acc = greedy_accuracy(model, tok, test, lambda t, r: reward(t, r),
                              max_new_tokens=engine_cfg.max_new_tokens)
        log(f"step {step} time {clock:.1f}s (sampling {sampling_s:.1f}s) accuracy {acc:.3f} "
            f"(evaluated in {time.perf_counter() - t0:.1f}s)")
        return {"step": step, "time": clock, "sampling_s": sampling_s, "eval_accuracy": acc}

    curve = [point(0, 0.0)]
    clock, step = 0.0, 0
    while clock < seconds and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        specs = rng.sample(train, cfg.data.batch_size)
        groups = sample_groups(sampler, tok, specs, n=cfg.producer.n_samples,
                               temperature=engine_cfg.temperature, top_p=engine_cfg.top_p,
                               max_new_tokens=engine_cfg.max_new_tokens, reward=reward,
                               step=step, autocast=engine_cfg.mixed_precision == "bf16")
        sampling_s += time.perf_counter() - t0
        rl_step(state, Batch(id=str(step), policy=policy, seq=step, groups=groups), step)
        if sampler is not model:  # the new weights into the sampling copy
            with torch.no_grad():
                for dst, src in zip(sampler.parameters(), model.parameters(), strict=True):
                    dst.copy_(src)
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
    ap = argparse.ArgumentParser(prog="python -m bench.sync_loop", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path,
                    help="a run directory whose warm-up ended, or a config without a warm-up")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--seconds", type=float, default=300.0, help="training seconds")
    ap.add_argument("--steps", type=int, default=None, help="at most this many steps")
    ap.add_argument("--every", type=int, default=None,
                    help="evaluate every N steps (default: the config's launch.eval_every)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="stop once held-out accuracy reaches this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None, help="default: the run's seed")
    ap.add_argument("--out", type=Path, default=None,
                    help="run directory of a config SOURCE ({out} in its paths; default "
                         "runs/sync-loop)")
    ap.add_argument("--json", type=Path, default=None, help="write the curve here")
    args = ap.parse_args()
    curve = run_sync(args.source, policy=args.policy, seconds=args.seconds,
                     max_steps=args.steps, every=args.every, threshold=args.threshold,
                     threads=args.threads, seed=args.seed, out=args.out,
                     log=lambda s: print(s, flush=True))
    if args.json:
        args.json.write_text(json.dumps(curve, indent=1))


if __name__ == "__main__":
    main()
