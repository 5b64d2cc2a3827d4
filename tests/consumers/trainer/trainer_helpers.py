"""Record factories and bus helpers shared by the trainer tests: those bench/trainer.py and
bench/lora.py use too live in :mod:`bench.lib.batches`; :func:`on_policy` is the tests' own."""

from __future__ import annotations

import numpy as np
import torch

from astraflow.core.records import Batch, pack_f32
from bench.lib.batches import (  # noqa: F401  (the tests import them from here)
    SEVEN,
    TOK,
    produce,
    random_batch,
    sample,
    sft_batch,
    trajectory,
)


@torch.no_grad()
def on_policy(batch: Batch, model: torch.nn.Module) -> Batch:
    """``batch`` with each trajectory's sampled-token logprobs replaced by ``model``'s own (at
    temperature 1): the RL step's importance ratios start near 1, as after real sampling. For
    a real pretrained model, whose logprobs of random tokens are far below the made-up ones
    of :func:`random_batch` (ratios ~0: no gradient to compare)."""
    import msgspec

    from astraflow.core.records import unpack

    groups = []
    for g in batch.groups:
        trajs = []
        for t in g.trajectories:
            ids = torch.from_numpy(unpack(t.token_ids, "<i4").astype(np.int64))[None]
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            own = lp.gather(-1, ids[0, 1:, None])[:, 0].tolist()
            trajs.append(msgspec.structs.replace(
                t, logprobs=pack_f32([0.0] * t.prompt_len + own[t.prompt_len - 1:])))
        groups.append(msgspec.structs.replace(g, trajectories=trajs))
    return msgspec.structs.replace(batch, groups=groups)
