"""Made-up trainer records on the tiny arithmetic model: trajectories, random and SFT batches,
writing them to a bus, sampling from a model (bench/trainer.py, bench/lora.py, and the trainer
tests through tests/consumers/trainer/trainer_helpers.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from astraflow.core.bus.types import Bus
from astraflow.core.records import (
    Batch,
    Group,
    Trajectory,
    encode,
    pack_f32,
    pack_i32,
    pack_u8,
    schema_header,
)
from astraflow.core.topics import topic_name
from astraflow.models.tiny import build_tokenizer

TOK = build_tokenizer("arith")


def trajectory(ids: Sequence[int], prompt_len: int, *, reward: float, logprobs: Sequence[float]
               | None = None, version: int = 0, tid: str = "t", group_id: str = "g",
               task_id: str = "task") -> Trajectory:
    n = len(ids)
    mask = [0] * prompt_len + [1] * (n - prompt_len)
    lp = list(logprobs) if logprobs is not None else [-2.8] * (n - prompt_len)
    return Trajectory(id=tid, task_id=task_id, group_id=group_id, token_ids=pack_i32(ids),
                      loss_mask=pack_u8(mask), logprobs=pack_f32([0.0] * prompt_len + lp),
                      versions=pack_i32([-1] * prompt_len + [version] * (n - prompt_len)),
                      prompt_len=prompt_len, reward=reward)


def random_batch(seq: int, *, seed: int = 0, groups: int = 4, group_size: int = 4,
                 vocab: tuple[int, int] = (3, 17), policy: str = "default",
                 version: int = 0, zero_groups: int = 0) -> Batch:
    """A batch of random ragged trajectories (prompt 3-5 tokens, completion 1-6) with 0/1
    rewards; the first ``zero_groups`` groups have all-equal rewards."""
    rng = np.random.default_rng(seed * 1000 + seq)
    out = []
    for g in range(groups):
        trajs = []
        for k in range(group_size):
            p = int(rng.integers(3, 6))
            c = int(rng.integers(1, 7))
            ids = [1] + rng.integers(*vocab, size=p + c - 1).tolist()
            reward = 1.0 if g < zero_groups else float(rng.integers(0, 2) if k > 1 else k)
            lp = (-rng.uniform(1.5, 4.0, size=c)).tolist()
            trajs.append(trajectory(ids, p, reward=reward, logprobs=lp, version=version,
                                    tid=f"{seq}-{g}-{k}", group_id=f"{seq}-{g}",
                                    task_id=f"task{g}"))
        out.append(Group(group_id=f"{seq}-{g}", task_id=f"task{g}", trajectories=trajs))
    return Batch(id=f"{policy}-{seq}", policy=policy, seq=seq, groups=out)


def produce(bus: Bus, run: str, batches: Sequence[Batch], policy: str = "default") -> None:
    producer = bus.producer()
    for b in batches:
        producer.produce(topic_name(run, "batches", policy), encode(b), key=policy.encode(),
                         headers=[schema_header(b)])
    producer.flush()
    producer.close()


def sft_batch(seq: int, n: int = 64) -> Batch:
    """Demonstrations of a+b= for one-digit a, b: the answer and <eos> are the loss tokens."""
    rng = np.random.default_rng(seq)
    trajs = []
    for k, (a, b) in enumerate(rng.integers(0, 10, size=(n, 2))):
        prompt = TOK(f"{a}+{b}=").input_ids  # <bos> prepended
        answer = TOK(str(a + b), add_special_tokens=False).input_ids + [TOK.eos_token_id]
        trajs.append(trajectory(prompt + answer, len(prompt), reward=0.0, tid=f"{seq}-{k}",
                                group_id=f"{seq}-{k}"))
    return Batch(id=f"default-{seq}", policy="default", seq=seq,
                 groups=[Group(group_id=f"{seq}-{k}", task_id=str(k), trajectories=[t])
                         for k, t in enumerate(trajs)])


SEVEN = TOK.convert_tokens_to_ids("7")


@torch.no_grad()
def sample(model: torch.nn.Module, prompts: list[list[int]], n: int, new: int,
           gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples per prompt at temperature 1: token ids and their logprobs."""
    model.eval()
    ids = torch.tensor(prompts).repeat_interleave(n, 0)
    logprobs = []
    for _ in range(new):
        lp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), -1)
        nxt = torch.multinomial(lp.exp(), 1, generator=gen)
        logprobs.append(lp.gather(-1, nxt))
        ids = torch.cat([ids, nxt], 1)
    return ids, torch.cat(logprobs, 1)
