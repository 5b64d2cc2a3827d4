"""The supervisor's events quote a role's log; brackets in it are text, not rich markup."""

from __future__ import annotations

import io

from rich.console import Console

from astraflow.run.orchestrate import event_printer


def test_an_event_quoting_a_gloo_error_prints_as_text() -> None:
    # the trainer's log tail when a rank of its gang was SIGKILLed (seen in a CI run, where
    # printing it ended `astraflow run` with rich.errors.MarkupError)
    msg = ("role trainer-default died (exit 1); restarting (1/3). Log tail:\n[rank0]: "
           "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
           "pair.cc:545] Read error [127.0.0.1]:6372: Connection reset by peer [bold]")
    out = io.StringIO()
    event_printer(Console(file=out, width=400, color_system=None))(msg)
    assert out.getvalue().strip() == msg
