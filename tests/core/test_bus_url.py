"""Bus URLs: an embedded path is percent-decoded, a '#' in one is refused (it would end the
path: the bus would go to another file, silently), and a run directory whose name has '#',
'?' or '%' gets its bus inside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.core.bus import open_bus, parse_url
from astraflow.core.errors import BusURLError


def test_embedded_paths_are_percent_decoded() -> None:
    assert parse_url("embedded:///runs/a%231/bus.db").path == Path("/runs/a#1/bus.db")
    assert parse_url("embedded:///runs/plain/bus.db?synchronous=full").options == {
        "synchronous": "full"}


@pytest.mark.parametrize("url", ["embedded:///runs/a#1/bus.db", "embedded:///runs/a#"])
def test_a_fragment_in_an_embedded_url_is_refused(url: str) -> None:
    with pytest.raises(BusURLError, match="%23"):
        parse_url(url)


@pytest.mark.parametrize("name", ["a#1", "b?x=1", "c%41"])
def test_a_run_directory_with_url_characters_holds_its_own_bus(tmp_path: Path,
                                                               name: str) -> None:
    out = tmp_path / name
    out.mkdir()
    bus = open_bus("embedded://{out}/bus.db", out, topics={"t": 1})
    try:
        assert bus.list_topics().keys() >= {"t"}
    finally:
        bus.close()
    assert (out / "bus.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("name", ["a#1", "b?x=1", "c%41", "plain"])
def test_embedded_url_round_trips_a_path(tmp_path: Path, name: str) -> None:
    from astraflow.core.bus import connect, embedded_url

    path = tmp_path / name / "bus.db"
    assert parse_url(embedded_url(path)).path == path
    bus = connect(embedded_url(path))
    try:
        assert parse_url(bus.url).path == path  # type: ignore[attr-defined]
    finally:
        bus.close()
    assert path.exists()
