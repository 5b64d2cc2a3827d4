"""Run by tests/core/test_forkserver.py through the fork server (``python -m forked_probe``):
writes what a role would see of its process, then waits for a signal."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time


def main() -> None:
    mode = sys.argv[1]
    if mode == "exit":
        print("exiting with", sys.argv[2])
        sys.exit(int(sys.argv[2]))
    if mode == "raise":
        raise RuntimeError("the probe failed on purpose")
    import numpy as np

    seen = {"pid": os.getpid(), "sid": os.getsid(0), "ppid": os.getppid(),
            "argv": sys.argv, "cwd": os.getcwd(), "main": __name__,
            "env": os.environ.get("FORKED_PROBE_VALUE"),
            "launcher": os.environ.get("ASTRAFLOW_LAUNCHER_PID"),
            "random": random.random(), "numpy": float(np.random.random()),
            "torch_loaded": "torch" in sys.modules,
            "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}
    print(json.dumps(seen))  # unbuffered: the test reads it from the log at once
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    if mode == "orphan":
        from astraflow.core.launcher import stop_when_orphaned

        stop_when_orphaned(0.1)
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
