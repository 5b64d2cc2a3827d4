"""The Weights & Biases sink: one wandb run named after the AstraFlow run, its config the
run's (secrets redacted), files under ``{out}/wandb``; ``pip install 'astraflow[wandb]'``.

``metrics.wandb_project`` names the project; ``metrics.wandb_mode`` (or ``WANDB_MODE``) picks
online, offline or disabled. Each write is one ``log`` call whose ``step`` field, declared as
every metric's x-axis, is the line's step: lines arrive out of order, which wandb's own
monotonic step would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class WandbSink:
    def __init__(self, *, out: Path, run: str, config: Mapping[str, Any],
                 options: Any = None) -> None:
        import wandb

        root = Path(out) / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=getattr(options, "wandb_project", None) or "astraflow",
                               name=run, config=dict(config), dir=str(out),
                               mode=getattr(options, "wandb_mode", None))
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")
        self.dir = Path(self._run.dir).parent  # the run's own directory (files/, run-*.wandb)

    def write(self, values: Mapping[str, float], step: int, wall_time: float) -> None:
        if values:
            self._run.log({**values, "step": step})

    def close(self) -> None:
        self._run.finish()
