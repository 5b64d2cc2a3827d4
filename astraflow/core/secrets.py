"""Secrets in config files: which values are secret, how a dump hides them, and the one
private file that keeps them for the roles.

A dumped ``config.yaml`` writes each secret (as :mod:`astraflow.core.redact` decides) as
``***`` and keeps the real values in :data:`SECRETS_FILE` beside it, created ``0600``.
:func:`astraflow.core.config.load` puts them back when it reads such a dump; a value still
redacted after that is a ConfigError, never a literal ``***`` sent to a server
(docs/operations.md)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from astraflow.core.redact import REDACTED, random_looking, redact_shapes, secret_key

#: in a run directory: the real values of the redacted fields of its config dumps (mode 0600)
SECRETS_FILE = "secrets.yaml"
_VERSION = 1
#: keys whose mapping holds only secrets, whatever each is called (``gateway.keys``: client
#: name -> API key)
_SECRET_MAPS = frozenset({"keys"})
#: ``***`` standing alone (not inside ``***bold***``): a value that still holds a redaction
_STANDALONE = re.compile(r"(?<![\w*])\*\*\*(?![\w*])")

Path_ = tuple[str | int, ...]
__all__ = ["REDACTED", "SECRETS_FILE", "keep_secrets", "read_secrets", "redact_url",
           "redacted_paths", "restore", "secret_at", "secret_key", "split", "write_private"]


def redact_url(url: str) -> str:
    """``url`` with the password of its user part and each secret query value as ``***``."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(secret_key(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if secret_key(k) else v) for k, v in pairs],
                              safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # untouched, byte for byte (``embedded:///abs`` keeps its empty host)
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{netloc}{parts.path}{'?' if query else ''}{query}{fragment}"


def secret_at(path: Path_) -> bool:
    """Is the value at ``path`` a secret by where it is (its key, the key of the list it is
    in, or a mapping of secrets)?"""
    names = [k for k in path if isinstance(k, str)]
    return bool(names) and (secret_key(names[-1]) or (
        len(path) >= 2 and path[-2] in _SECRET_MAPS))


def _redact_value(path: Path_, value: Any) -> Any:
    """``value`` as a dump shows it: whole, or ``***`` under a secret's key (a number too: a
    numeric token is a token), or with its secret parts (a URL's password, a ``Bearer ...``,
    an ``hf_...``) as ``***``; a long random-looking string is taken for a secret whole."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return value
    if secret_at(path):
        return REDACTED if value != "" else value
    if not isinstance(value, str):
        return value
    if random_looking(value):
        return REDACTED
    return redact_shapes(redact_url(value))


def split(data: Any) -> tuple[Any, list[tuple[Path_, str]]]:
    """``data`` (plain YAML-able values) with every secret redacted, and the secrets as
    (path, real value) pairs."""
    secrets: list[tuple[Path_, str]] = []

    def walk(node: Any, path: Path_) -> Any:
        if isinstance(node, dict):
            return {k: walk_leaf(k, v, (*path, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk_leaf(i, v, (*path, i)) for i, v in enumerate(node)]
        return node

    def walk_leaf(key: str | int, value: Any, path: Path_) -> Any:
        if isinstance(value, dict | list):
            return walk(value, path)
        hidden = _redact_value(path, value)
        if hidden != value:
            secrets.append((path, value))
        return hidden

    return walk(data, ()), secrets


def _leaves(node: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    items = (node.items() if isinstance(node, dict)
             else enumerate(node) if isinstance(node, list) else ())
    for k, v in items:
        if isinstance(v, dict | list):
            yield from _leaves(v, (*path, k))
        else:
            yield (*path, k), v


def redacted_paths(data: Any) -> list[str]:
    """The dotted paths of values in ``data`` that are still redacted."""
    return [".".join(map(str, p)) for p, v in _leaves(data)
            if isinstance(v, str) and _STANDALONE.search(v)]


def restore(data: Any, secrets: list[tuple[Path_, str]]) -> Any:
    """Put each kept secret back where ``data`` holds exactly its redacted form (a value a
    person changed in the dump stays theirs)."""
    for path, real in secrets:
        node = data
        try:
            for k in path[:-1]:
                node = node[k]
            here = node[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(here, str) and here == _redact_value(path, real):
            node[path[-1]] = real
    return data


def read_secrets(directory: Path) -> list[tuple[Path_, str]]:
    """The secrets kept in ``directory``'s :data:`SECRETS_FILE` (none: no file)."""
    import yaml

    try:
        loaded = yaml.safe_load((directory / SECRETS_FILE).read_text())
    except FileNotFoundError:
        return []
    entries = loaded.get("secrets", []) if isinstance(loaded, dict) else []
    return [(tuple(e["path"]), _kept(e["value"])) for e in entries
            if isinstance(e, dict) and isinstance(e.get("path"), list) and "value" in e]


def _kept(value: Any) -> Any:
    """A kept value as it was (a numeric token stays a number), anything else as text."""
    return value if isinstance(value, str | int | float) and not isinstance(
        value, bool) else str(value)


def keep_secrets(directory: Path, secrets: list[tuple[Path_, str]]) -> None:
    """Add ``secrets`` to ``directory``'s :data:`SECRETS_FILE` (a path kept before takes the
    new value); the file is created 0600."""
    if not secrets and not (directory / SECRETS_FILE).exists():
        return
    import yaml

    kept = dict(read_secrets(directory))
    kept.update(secrets)
    text = ("# the real values of the fields shown as *** in this run directory's config "
            "dumps;\n# read by its roles; keep it private (mode 0600)\n")
    text += yaml.safe_dump({"version": _VERSION, "secrets": [
        {"path": list(p), "value": v} for p, v in kept.items()]}, sort_keys=False)
    write_private(directory / SECRETS_FILE, text)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only: a new file created 0600 (so it
    is never readable by others, not even for a moment), renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
