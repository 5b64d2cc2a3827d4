"""The workflow registry (its own module so workflows can import it without cycles)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from astraflow.core.registry import Registry

WORKFLOWS: Registry[Callable[..., Any]] = Registry("workflow", group="astraflow.workflows")
