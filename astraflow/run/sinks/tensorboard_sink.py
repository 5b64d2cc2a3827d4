"""The TensorBoard sink: an event file under ``metrics.tensorboard_dir`` (default
``{out}/tensorboard``), one run directory named after the run, scalars as ``simple_value``
(what TensorBoard's scalar dashboard and its ``EventAccumulator`` read) and the config as a
text summary. Written with the ``tensorboard`` package alone (no torch, no TensorFlow):
``pip install 'astraflow[tensorboard]'``; view with ``tensorboard --logdir runs/<run>/tensorboard``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TensorBoardSink:
    def __init__(self, *, out: Path, run: str, config: Mapping[str, Any],
                 options: Any = None) -> None:
        import yaml
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        from astraflow.core.paths import expand

        root = Path(expand(getattr(options, "tensorboard_dir", "{out}/tensorboard"), out=out))
        self.logdir = root / run
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._writer = EventFileWriter(str(self.logdir))
        text = "```\n" + yaml.safe_dump(dict(config), sort_keys=False) + "```"
        self._writer.add_event(self._event(wall_time=time.time(), step=0,
                                           summary=text_pb("config", text)))
        self._writer.flush()

    def write(self, values: Mapping[str, float], step: int, wall_time: float) -> None:
        if not values:
            return
        summary = self._summary(value=[self._summary.Value(tag=k, simple_value=float(v))
                                       for k, v in values.items()])
        self._writer.add_event(self._event(wall_time=wall_time, step=step, summary=summary))

    def close(self) -> None:
        self._writer.close()
