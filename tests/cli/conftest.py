"""Fixtures of the CLI tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _user_code_dirs_stay_in_their_test(sys_path_restored: None) -> None:
    """A command run in this process (CliRunner) puts the working directory and its config's
    directory on sys.path and $PYTHONPATH: undone after each test (tests/conftest.py)."""
