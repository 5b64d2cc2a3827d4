"""A train state on identical batches, run alone or as ranks (tests of parallelism): the tests
fork its processes from a preloaded interpreter (tests/rank_launcher.py); it runs as well under
torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 fsdp_worker.py \
        MODEL_DIR OUT --parallel fsdp --steps 5

Builds the state as the trainer does (:func:`build_train_state`), takes ``--steps`` RL steps on
``random_batch(0..steps-1)`` and writes (rank 0) ``OUT/result.json`` (per-step loss and grad
norm, each rank's local parameter count) and ``OUT/params.safetensors`` (the whole weights
after the last step) and ``OUT/optim.safetensors`` (the whole AdamW state by parameter name). ``--save`` / ``--load`` checkpoint through :class:`CheckpointDir`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--parallel", default="ddp")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--first", type=int, default=0, help="seq of the first batch")
    ap.add_argument("--budget", type=int, default=30, help="micro_batch_tokens")
    ap.add_argument("--save", help="checkpoint root to save into after the steps")
    ap.add_argument("--load", help="checkpoint root to resume from before the steps")
    ap.add_argument("--mode", default="rl")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--kl", action="store_true", help="loss.kl k3 against a reference model")
    ap.add_argument("--batches", help="a file of the RL batches to train on, one encoded "
                                      "Batch record a line (hex), instead of random_batch")
    args = ap.parse_args()

    import torch
    from safetensors.torch import save_file
    from trainer_helpers import random_batch, sft_batch

    from astraflow.consumers.trainer.build import build_train_state, step_function
    from astraflow.consumers.trainer.checkpoint import CheckpointDir, CheckpointMeta
    from astraflow.consumers.trainer.config import TrainerConfig
    from astraflow.consumers.trainer.sharding import local_numel

    tc = TrainerConfig.model_validate({
        "parallel": args.parallel, "micro_batch_tokens": args.budget, "mode": args.mode,
        "optimizer": {"lr": args.lr}, "deterministic": True, "threads": 1,
        **({"loss": {"kl": "k3", "kl_coef": 0.5}} if args.kl else {})})
    state = build_train_state(tc, args.model)
    step = step_function(tc.mode)
    version = 0
    if args.load:
        meta = CheckpointDir(args.load, run="r", policy="default").load(
            state.model, state.optimizer)
        assert meta is not None, "no checkpoint"
        version = meta.version
    given = None
    if args.batches:
        from astraflow.core.records import Batch, decode

        given = [decode(bytes.fromhex(x), Batch)
                 for x in Path(args.batches).read_text().split()]
    rows = []
    for k in range(args.first, args.first + args.steps):
        batch = (given[k] if given is not None else sft_batch(k, n=12) if args.mode == "sft"
                 else random_batch(k, groups=5, group_size=4))
        m = step(state, batch, version)
        version += 1
        rows.append({"loss": m["loss"], "grad_norm": m["grad_norm"], "tokens": m["tokens"],
                     "kl": m.get("kl")})
    if args.save:
        CheckpointDir(args.save, run="r", policy="default").save(
            state.model, state.optimizer, CheckpointMeta(version=version))
    full = state.state_tensors()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(state.model, state.optimizer,
                                   options=StateDictOptions(full_state_dict=True))
    optim = {f"{name}.{key}": v.detach().to("cpu", copy=True).reshape(-1)
             for name, st in osd["state"].items() for key, v in st.items()}
    ref = state.ref_model
    numel = torch.tensor([local_numel(state.model), local_numel(ref) if ref is not None else 0])
    if state.world > 1:
        import torch.distributed as dist

        numels = [torch.zeros_like(numel) for _ in range(state.world)]
        dist.all_gather(numels, numel)
    else:
        numels = [numel]
    if state.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in full.items()},
                  str(out / "params.safetensors"))
        save_file(optim, str(out / "optim.safetensors"))
        total = sum(v.numel() for k, v in state.model.named_parameters())
        (out / "result.json").write_text(json.dumps({
            "steps": rows, "world": state.world, "local_numel": [int(n[0]) for n in numels],
            "ref_local_numel": [int(n[1]) for n in numels],
            "version": version, "params_total": total}))


if __name__ == "__main__":
    main()
