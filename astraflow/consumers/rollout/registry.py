"""Name → callable registries for workflows, rewards and tools.

A name is either registered (``@workflows.register("single_turn")``) or a user's module path
``my_pkg.module:function``, imported on first use, so users never edit the package. Resolving a
path imports code: only names from the config may be paths, unless the config says otherwise
(a task's workflow: :meth:`~.runtime.Runtime.workflow`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from astraflow.core.errors import AstraflowError

F = TypeVar("F", bound=Callable[..., object])


class RegistryError(AstraflowError):
    """A name is neither registered nor an importable ``module:function``."""


class Registry(Generic[F]):
    """Callables by name; ``resolve`` also imports ``module.path:function``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}
        self._loaded: dict[str, F] = {}  # module paths resolved so far (not registered names)

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            self._items[name] = fn
            return fn

        return deco

    def add(self, name: str, fn: F) -> None:
        self._items[name] = fn

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` is registered (a module path resolved before is not)."""
        return name in self._items

    def resolve(self, name: str) -> F:
        fn = self._items.get(name) or self._loaded.get(name)
        if fn is not None:
            return fn
        if ":" not in name:
            raise RegistryError(f"unknown {self.kind} {name!r}; valid: "
                                f"{', '.join(self.names()) or '(none)'}, or 'module.path:function'")
        fn = load_object(name, self.kind)  # type: ignore[assignment]
        self._loaded[name] = fn  # type: ignore[assignment]
        return fn  # type: ignore[return-value]


def load_object(path: str, kind: str = "object") -> Callable[..., object]:
    """Import ``module.path:attr`` (``attr`` may be dotted) and check it is callable."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise RegistryError(f"bad {kind} path {path!r}: expected 'module.path:function'")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        raise RegistryError(f"{kind} {path!r}: cannot import module {module_name!r} ({e}); is it "
                            "installed or on PYTHONPATH?") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RegistryError(f"{kind} {path!r}: module {module_name!r} has no attribute "
                                f"{attr!r}") from None
    if not callable(obj):
        raise RegistryError(f"{kind} {path!r} is a {type(obj).__name__}, not a callable")
    return obj
