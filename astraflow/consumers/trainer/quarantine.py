"""Poison batches: a batch that makes the trainer's step raise is tried a bounded number of
times, then quarantined — dead-lettered with the error — and training goes on with the next.

Tries are written to :data:`FILE` beside the checkpoints before each one, so a try that kills
the process counts too; quarantined ids stay there (the newest :data:`KEEP`), so a restart from
an older checkpoint skips them. Only a single-process trainer quarantines (docs/trainer.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from astraflow.core.errors import AstraflowError

log = logging.getLogger("astraflow.trainer")

FILE = "quarantine.json"
KEEP = 1000


class PoisonBatchError(AstraflowError):
    """A batch failed every try: the runtime dead-letters it with this error."""


class Quarantine:
    """The tries of the batch in training and the batches quarantined, in ``root/FILE``
    (nothing on disk when ``root`` is None)."""

    def __init__(self, root: Path | None, max_tries: int = 2) -> None:
        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}")
        self.path = None if root is None else Path(root) / FILE
        self.max_tries = max_tries
        self.trying = ""
        self.tries = 0
        self.quarantined: list[str] = []
        self._load()

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            self.trying = str(data.get("trying", ""))
            self.tries = int(data.get("tries", 0))
            self.quarantined = [str(x) for x in data.get("quarantined", [])][-KEEP:]
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("unreadable %s (%s): starting with no tries counted", self.path, e)

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"trying": self.trying, "tries": self.tries,
                                   "quarantined": self.quarantined[-KEEP:]}))
        os.replace(tmp, self.path)

    def is_quarantined(self, batch_id: str) -> bool:
        return batch_id in self.quarantined

    def begin(self, batch_id: str) -> int:
        """A try of ``batch_id`` starts: its number, counting the tries earlier processes
        began and never finished."""
        if batch_id != self.trying:
            self.trying, self.tries = batch_id, 0
        self.tries += 1
        self._save()
        return self.tries

    def succeeded(self) -> None:
        """The try begun last trained: a later replay of the batch (a restart from an older
        checkpoint) is no retry."""
        self.trying, self.tries = "", 0
        self._save()

    def quarantine(self, batch_id: str) -> None:
        self.quarantined.append(batch_id)
        self.quarantined = self.quarantined[-KEEP:]
        self.trying, self.tries = "", 0
        with contextlib.suppress(OSError):
            self._save()
