"""Bus URLs: ``embedded:///abs/path/bus.db``, ``embedded://rel/path.db``,
``kafka://host:port[,host:port][?client.setting=value&...]``.

An embedded path is percent-decoded, as a URL's path is: a directory named ``a#1`` is
``embedded:///runs/a%231/bus.db`` (``{out}`` in a run's bus URL is encoded so)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from astraflow.core.errors import BusURLError

SCHEMES = ("embedded", "kafka")

#: A run's bus: the embedded file ``bus.db`` in its run directory (``{out}``, expanded by
#: :func:`astraflow.core.bus.open_bus`). The default of the experiment's ``bus.url``, and,
#: in :data:`DEFAULT_OUT`, of the ``--bus`` of the commands that take no run directory.
DEFAULT_URL = "embedded://{out}/bus.db"
#: The run directory of the commands that take a bus but no run (``astraflow topics``,
#: ``astraflow inspect``): ``./.astraflow``.
DEFAULT_OUT = ".astraflow"


def default_url(out: str | Path) -> str:
    """:data:`DEFAULT_URL` with ``out`` for the run directory (percent-encoded)."""
    return DEFAULT_URL.replace("{out}", url_path(out))


@dataclass(frozen=True)
class BusURL:
    scheme: str
    path: Path | None = None  # embedded
    bootstrap: str = ""  # kafka: "host:port,host:port"
    options: dict[str, str] = field(default_factory=dict)


def url_path(path: str | Path) -> str:
    """A file path as it goes into a bus URL: percent-encoded, so that '#', '?' and '%' in it
    stay part of the path (:func:`parse_url` decodes it)."""
    return quote(str(path), safe="/")


def embedded_url(path: str | Path) -> str:
    """The URL of the embedded bus in the file ``path``."""
    return f"embedded://{url_path(path)}"


def parse_url(url: str) -> BusURL:
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise BusURLError(
            f"unknown bus scheme {parts.scheme!r} in {url!r}; valid: "
            "embedded:///path/to/bus.db, kafka://host:port[,host:port]")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    if parts.scheme == "embedded":
        if parts.fragment or url.endswith("#"):
            raise BusURLError(
                f"embedded bus URL {url!r}: '#' starts a URL fragment, so the file path would "
                "end before it; write it as %23 (paths in bus URLs are percent-decoded)")
        raw = unquote(parts.netloc + parts.path)
        if not raw:
            raise BusURLError(f"embedded bus URL {url!r} has no file path; "
                              "e.g. embedded:///tmp/run/bus.db")
        return BusURL("embedded", path=Path(raw).expanduser(), options=options)
    hosts = parts.netloc
    if not hosts:
        raise BusURLError(f"kafka bus URL {url!r} has no bootstrap servers; "
                          "e.g. kafka://127.0.0.1:9092")
    for hp in hosts.split(","):
        host, sep, port = hp.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise BusURLError(f"bad bootstrap server {hp!r} in {url!r}; expected host:port")
    return BusURL("kafka", bootstrap=hosts, options=options)
