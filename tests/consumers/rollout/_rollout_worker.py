"""A rollout worker run as a separate OS process by the multi-worker tests.

usage: python _rollout_worker.py CONFIG_JSON OUT_DIR WORKER_ID

Runs ``run_configured_worker`` on the experiment config (JSON) until SIGTERM, then drains and
exits 0.
"""

from __future__ import annotations

import json
import logging
import signal
import sys

from astraflow.config import ExperimentConfig
from astraflow.run.roles import run_configured_worker


def main() -> None:
    config, out, worker_id = sys.argv[1:4]
    logging.basicConfig(level=logging.WARNING, format=f"{worker_id} %(levelname)s %(message)s")
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    cfg = ExperimentConfig.model_validate(json.loads(config))
    stats = run_configured_worker(cfg, out, worker_id=worker_id, should_stop=lambda: stop)
    print("stats", json.dumps(stats.as_dict()), flush=True)


if __name__ == "__main__":
    main()
