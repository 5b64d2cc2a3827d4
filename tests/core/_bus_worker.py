"""A consume → produce worker run as a separate OS process by the conformance tests.

usage: python _bus_worker.py URL GROUP IN_TOPIC OUT_TOPIC DLQ_TOPIC DELAY_S SESSION_TIMEOUT_S

Copies every Task of IN_TOPIC to OUT_TOPIC (same key) through the standard runner, sleeping
DELAY_S per record so that a test can kill it mid-stream. Runs until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import time

from astraflow.core.bus import connect
from astraflow.core.records import Task
from astraflow.core.stream import Output, run_processor


def main() -> None:
    url, group, src, dst, dlq, delay, session = sys.argv[1:8]
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    bus = connect(url)

    def handle(task: Task, msg: object) -> list[Output]:
        time.sleep(float(delay))
        return [Output(dst, task, task.id.encode())]

    print("ready", flush=True)
    run_processor(bus, group=group, inputs=[src], kind=Task, handle=handle, dlq=dlq,
                  component=f"worker-{group}", batch_size=8, poll_timeout=0.2,
                  session_timeout=float(session), should_stop=lambda: stop)
    bus.close()


if __name__ == "__main__":
    main()
