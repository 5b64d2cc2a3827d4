"""Fixtures of the CLI tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _user_code_dirs_stay_in_their_test() -> Iterator[None]:
    """A command run in this process (CliRunner) puts the working directory and its config's
    directory on sys.path and $PYTHONPATH (`find_user_code`, as it does for a user): undone
    after each test, so a test's temporary directory does not reach the next tests."""
    path, env = list(sys.path), os.environ.get("PYTHONPATH")
    yield
    sys.path[:] = path
    if env is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = env
