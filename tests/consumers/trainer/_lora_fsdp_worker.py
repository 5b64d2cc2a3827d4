"""One rank of tests/consumers/trainer/test_trainer_lora_fsdp.py (run as a rank by tests/rank_launcher.py, or under torchrun; gloo): a tiny model
wrapped with peft LoRA first, then FSDP2 ``fully_shard`` per decoder block and the root (the
frozen base sharded too); a few AdamW steps; rank 0 writes the gathered tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist


def train(model_dir: str, *, shard: bool, steps: int = 3) -> dict[str, torch.Tensor]:
    from astraflow.consumers.trainer.build import load_model
    from astraflow.consumers.trainer.config import LoraSection
    from astraflow.consumers.trainer.lora import wrap

    torch.manual_seed(0)
    model, _ = load_model(model_dir, torch.device("cpu"))
    model = wrap(model, LoraSection(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))
    if shard:
        from torch.distributed.fsdp import fully_shard

        for block in model.base_model.model.model.layers:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 17, (4, 12), generator=g)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(
            model(input_ids=ids).logits[:, :-1].reshape(-1, 17), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = {}
    for n, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        state[n] = t.detach().clone().contiguous()
    state["__moments__"] = torch.tensor([float(len(opt.state))])
    return state


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    state = train(model_dir, shard=True)
    if dist.get_rank() == 0:
        from safetensors.torch import save_file

        save_file(state, str(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
