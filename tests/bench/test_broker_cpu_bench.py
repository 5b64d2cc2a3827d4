"""bench/broker_cpu.py runs both arms on real brokers and prints its table."""

from __future__ import annotations

import re

import pytest

from bench import broker_cpu


@pytest.mark.slow  # two JVM starts
def test_the_broker_cpu_bench_measures_both_arms(capsys: pytest.CaptureFixture[str]) -> None:
    assert broker_cpu.main(["--idle", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (dev flags|JVM defaults) \(.*\) \| ([\d.]+) \| ([\d.]+) \|$", out,
                      re.M)
    assert [r[0] for r in rows] == ["dev flags", "JVM defaults"], out
    assert all(float(start) > 0 for _, start, _ in rows), out  # a JVM start costs CPU


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        broker_cpu.main(["--idle", "0"])
