"""Path templates ({out}, {policy}, ...) and opening a run's bus from plain values."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.core.bus import open_bus
from astraflow.core.errors import ConfigError
from astraflow.core.paths import expand
from astraflow.core.topics import run_topics


def test_expand_fills_out_with_the_resolved_run_directory_and_named_fields(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert expand("{out}/ckpt/trainer-{policy}", out="run", policy="solver") == \
        f"{tmp_path.resolve()}/run/ckpt/trainer-solver"
    assert expand("/abs/no-fields") == "/abs/no-fields"


def test_expand_substitutes_once_so_values_with_braces_stay_as_given() -> None:
    assert expand("/w/{worker}", worker="a/{policy}") == "/w/a/{policy}"


def test_a_placeholder_without_a_value_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown placeholder \{policy\} in '\{out\}/x-"
                                          r"\{policy\}'; valid here: \{out\}, \{worker\}"):
        expand("{out}/x-{policy}", out="/r", worker="w")


def test_open_bus_expands_the_url_and_creates_the_given_topics(tmp_path: Path) -> None:
    topics = run_topics("r1", ["a", "b"], {"tasks": 3})
    bus = open_bus("embedded://{out}/bus.db", tmp_path, topics=topics)
    try:
        assert bus.url == f"embedded://{tmp_path.resolve()}/bus.db"
        assert {t: n for t, n in bus.list_topics().items() if t in topics} == topics
    finally:
        bus.close()
    bare = open_bus("embedded://{out}/other.db", tmp_path)
    try:
        assert bare.list_topics() == {}
    finally:
        bare.close()
