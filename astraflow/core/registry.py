"""Name → callable registries: the one idiom of every pluggable part (workflows, rewards,
tools, engines, policies, actuators, weight stores).

A name resolves, in this order, to a callable registered in code (``@WORKFLOWS.register(...)``
or ``WORKFLOWS.add(name, "pkg.module:fn")``, imported on first use), an entry point of the
registry's group (``astraflow.workflows``, ...), or a ``module.path:attr`` written in the
config, also found in the config's directory (:func:`add_code_dirs`). Code wins over an entry
point of the same name (docs/plugins.md)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from astraflow.core.errors import AstraflowError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

F = TypeVar("F", bound=Callable[..., Any])


class RegistryError(AstraflowError):
    """A name is neither registered, nor an installed entry point, nor an importable
    ``module:attr``; or what it names is not callable.

    ``reason`` says which step failed (``unknown``, ``bad path``, ``import``, ``attribute``,
    ``not callable``, ``entry point``), with ``path``, ``module`` and ``attr`` of the name and
    ``cause`` the underlying error's text, so a caller can word the problem for its config
    (a policy's ``data.pre_rollout[0]: ...``)."""

    def __init__(self, message: str, *, reason: str = "", path: str = "", module: str = "",
                 attr: str = "", cause: str = "") -> None:
        super().__init__(message)
        self.reason, self.path, self.module, self.attr, self.cause = (
            reason, path, module, attr, cause)


def is_path(name: str) -> bool:
    """Whether ``name`` is a ``module:attr`` path rather than a plain name."""
    return ":" in name


def load_object(path: str, kind: str = "object") -> Callable[..., Any]:
    """Import ``module.path:attr`` (``attr`` may be dotted) and check it is callable."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise RegistryError(f"bad {kind} path {path!r}: expected 'module.path:function'",
                            reason="bad path", path=path, module=module_name, attr=attr)
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        raise RegistryError(f"{kind} {path!r}: cannot import module {module_name!r} ({e}); is "
                            "it installed, a file in the current directory or the config's "
                            "directory, or on PYTHONPATH?", reason="import", path=path,
                            module=module_name, attr=attr, cause=str(e)) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RegistryError(f"{kind} {path!r}: module {module_name!r} has no attribute "
                                f"{attr!r}", reason="attribute", path=path,
                                module=module_name, attr=attr) from None
    if not callable(obj):
        raise RegistryError(f"{kind} {path!r} is a {type(obj).__name__}, not a callable",
                            reason="not callable", path=path, module=module_name, attr=attr)
    return obj


def add_code_dirs(*dirs: str | Path) -> list[str]:
    """Make a user's own modules in ``dirs`` (the current directory, the config's directory)
    importable, as ``PYTHONPATH=DIR`` would: each directory (absolute) goes in front on
    ``sys.path`` of this process and on ``$PYTHONPATH`` of its environment, so that every
    process it starts (the roles of `astraflow run`, whatever their working directory) finds
    the same modules. Returns the directories this put on ``sys.path``."""
    paths = list(dict.fromkeys(str(Path(d).resolve()) for d in dirs))
    env = [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d]
    os.environ["PYTHONPATH"] = os.pathsep.join([*(d for d in paths if d not in env), *env])
    added = [d for d in paths if d not in sys.path]
    sys.path[0:0] = added
    if added:
        importlib.invalidate_caches()
    return added


@cache
def entry_points(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group`` in the installed distributions, by name (read once per
    process: what is installed does not change under a running role)."""
    from importlib.metadata import entry_points as installed

    return {ep.name: ep for ep in installed(group=group)}


def distribution(ep: EntryPoint) -> str:
    """``name version`` of the distribution that declares ``ep`` (``?`` when unknown)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?"
    return f"{dist.metadata['Name']} {dist.version}"


@dataclass(frozen=True)
class Origin:
    """Where a registered name comes from, for ``astraflow plugins``."""

    name: str
    source: str  # "built-in" (registered in code) or "entry point"
    target: str  # module:attr of the callable
    distribution: str = ""  # entry points: the distribution that declares it
    shadowed: bool = False  # an entry point hidden by a built-in of the same name


def _target(obj: object) -> str:
    if isinstance(obj, str):
        return obj
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[F]):
    """Callables by name. ``kind`` words the messages (``unknown workflow 'x'``); ``group``
    is the entry-point group a user's package registers into (None: code only)."""

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._items: dict[str, F | str] = {}  # a str is a lazy "module:attr"
        self._loaded: dict[str, F] = {}  # "module:attr" -> what it imported (lazy, plug-in, path)

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            self.add(name, fn)
            return fn

        return deco

    def add(self, name: str, fn: F | str) -> None:
        """Register ``fn`` as ``name``; a ``"module:attr"`` string is imported on first use."""
        if isinstance(fn, str) and not is_path(fn):
            raise RegistryError(f"{self.kind} {name!r}: {fn!r} is not a 'module.path:attr' "
                                "string", reason="bad path", path=fn)
        self._items[name] = fn

    def _plugins(self) -> dict[str, EntryPoint]:
        return entry_points(self.group) if self.group else {}

    def names(self) -> list[str]:
        """Every name that resolves without a path: registered and installed entry points."""
        return sorted({*self._items, *self._plugins()})

    def builtins(self) -> list[str]:
        """The names registered in code."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered or an installed entry point (a module path resolved
        before is not: a path is only ever trusted where the caller says so)."""
        return name in self._items or name in self._plugins()

    def __iter__(self) -> Iterator[str]:
        """The names registered in code (see :meth:`names` for the entry points too)."""
        return iter(self.builtins())

    def __getitem__(self, name: str) -> F:
        return self.resolve(name)

    def resolve(self, name: str) -> F:
        """The callable ``name`` names (see the module docstring for the order)."""
        item = self._items.get(name)
        if item is not None and not isinstance(item, str):
            return item
        plugin = self._plugins().get(name) if item is None else None
        target = item or (plugin.value if plugin is not None else name)
        fn = self._loaded.get(target)  # keyed by what the name names now, not by the name
        if fn is not None:
            return fn
        if plugin is not None:
            fn = self._load_entry_point(plugin)
        elif is_path(target):
            fn = load_object(target, self.kind)  # type: ignore[assignment]
        else:
            raise RegistryError(f"unknown {self.kind} {name!r}; valid: "
                                f"{', '.join(self.names()) or '(none)'}, or 'module.path:function'",
                                reason="unknown", path=name)
        self._loaded[target] = fn  # type: ignore[assignment]
        return fn  # type: ignore[return-value]

    def _load_entry_point(self, ep: EntryPoint) -> F:
        where = f"{self.kind} {ep.name!r} (entry point {ep.value!r} of {distribution(ep)}, " \
                f"group {self.group})"
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001 - a plug-in's import may raise anything; said here
            raise RegistryError(f"{where} cannot be loaded: {type(e).__name__}: {e}; fix or "
                                "reinstall that package, or uninstall it",
                                reason="entry point", path=ep.value, cause=str(e)) from None
        if not callable(obj):
            raise RegistryError(f"{where} is a {type(obj).__name__}, not a callable",
                                reason="not callable", path=ep.value)
        return obj

    def origins(self) -> list[Origin]:
        """Every name with where it comes from, built-ins first, then entry points."""
        out = [Origin(n, "built-in", _target(self._items[n])) for n in self.builtins()]
        for name, ep in sorted(self._plugins().items()):
            out.append(Origin(name, "entry point", ep.value, distribution(ep),
                              shadowed=name in self._items))
        return out


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``package.<exports[name]>`` when ``name`` is
    first read, so importing a package stays light (torch loads with the name that needs it)::

        __getattr__ = lazy_exports(__name__, {"Trainer": "loop"})
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__


__all__ = ["Origin", "Registry", "RegistryError", "add_code_dirs", "entry_points", "is_path",
           "lazy_exports", "load_object"]
