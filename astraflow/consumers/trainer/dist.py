"""Data parallelism across processes (``accelerate launch`` / ``torchrun``): one reader.

The batches topic has one partition per policy, so one process reads it: rank 0 is the
trainer on the bus (consumer, publisher, checkpoints, metrics). It hands every batch it
accepts to the other ranks as the record's msgpack bytes (a length, then a uint8 tensor:
no pickle) over ``torch.distributed.broadcast``; an empty message tells them to stop. Every
rank then runs the same step on its share of the micro-batches
(:func:`~astraflow.consumers.trainer.batching.micro_batches` with ``shard``) and the
gradients are summed (:func:`~astraflow.consumers.trainer.state.apply_gradients`).

Under fsdp some of rank 0's other work is a collective too (gathering the weights to publish,
writing a sharded checkpoint): rank 0 first sends a *command* (a size of ``COMMAND``, then
the command's bytes, e.g. ``b"gather"`` or ``b"save:12"``) so that every rank joins it.
"""

from __future__ import annotations

import torch

STOP = -1
COMMAND = -2


class BatchChannel:
    """Rank 0 → every rank: the next batch's bytes, or stop."""

    def __init__(self, device: torch.device) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("BatchChannel needs torch.distributed to be initialised "
                               "(run under accelerate launch or torchrun)")
        self.device = device
        self._dist = dist

    def send(self, data: bytes | None) -> None:
        """Rank 0: broadcast ``data`` (None: stop)."""
        size = torch.tensor([STOP if data is None else len(data)], dtype=torch.int64,
                            device=self.device)
        self._dist.broadcast(size, src=0)
        if data:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
            self._dist.broadcast(payload, src=0)

    def command(self, op: bytes) -> None:
        """Rank 0: tell every rank to join the collective ``op``."""
        self._dist.broadcast(torch.tensor([COMMAND], dtype=torch.int64, device=self.device),
                             src=0)
        self.send(op)

    def recv(self) -> bytes | None:
        """Other ranks: the next batch's bytes, or None to stop."""
        kind, data = self.recv_message()
        if kind == "command":
            raise RuntimeError(f"rank 0 sent command {data!r} where a batch was expected")
        return data

    def recv_message(self) -> tuple[str, bytes | None]:
        """Other ranks: ("batch", bytes), ("command", bytes) or ("stop", None)."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._dist.broadcast(size, src=0)
        n = int(size.item())
        if n == STOP:
            return "stop", None
        if n == COMMAND:
            op = self.recv()
            return "command", op
        return "batch", self._payload(n)

    def _payload(self, n: int) -> bytes:
        payload = torch.empty(n, dtype=torch.uint8, device=self.device)
        if n:
            self._dist.broadcast(payload, src=0)
        return payload.cpu().numpy().tobytes()
