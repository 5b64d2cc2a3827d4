"""Data parallelism across processes (``accelerate launch`` / ``torchrun``): one reader.

Rank 0 is the trainer on the bus and broadcasts every batch it accepts to the other ranks as
the record's msgpack bytes (no pickle; an empty message means stop); every rank steps on its
share of the micro-batches and the gradients are summed. Under fsdp, collective work (gathering,
saving) is announced first as a *command* (e.g. ``b"gather"``, ``b"save:12"``) so every rank
joins it.
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
