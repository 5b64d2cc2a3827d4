"""What the CLI tests share: the CLI run as a subprocess, and its output made comparable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def astraflow(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m astraflow.cli.app ARGS`` in ``cwd``, its output captured."""
    return subprocess.run([sys.executable, "-m", "astraflow.cli.app", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def said(result: object) -> str:
    """The output with rich's line wrapping and panel borders undone."""
    return " ".join(result.output.replace("│", " ").split())  # type: ignore[attr-defined]
