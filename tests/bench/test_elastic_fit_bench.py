"""bench/elastic_fit.py: its simplex search finds a known minimum within the bounds, and the
whole script (a fit cut to two iterations, the table on one seed) runs and prints the
paper's rows beside the fitted ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import elastic_fit

ROOT = Path(__file__).resolve().parents[2]


def test_the_simplex_finds_a_known_minimum_and_stays_in_bounds() -> None:
    target = [3.0, 12.5, 2.0, 6.0, 0.9, 23.2]
    x, f = elastic_fit.nelder_mead(
        lambda v: sum((a - b) ** 2 for a, b in zip(v, target, strict=True)),
        [p[3] for p in elastic_fit.PARAMS], iters=400)
    assert f < 1e-4 and x == pytest.approx(target, abs=0.01)
    # a minimum outside the bounds: the search ends on the bound
    x, _ = elastic_fit.nelder_mead(lambda v: (v[0] - 100.0) ** 2, [4.0] * 6, iters=200)
    assert x[0] == pytest.approx(elastic_fit.PARAMS[0][2])


@pytest.mark.slow
def test_the_script_fits_and_prints_the_table() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.elastic_fit", "--slots",
                          "4", "--iters", "2", "--seeds", "1"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "## slots 4: loss" in out.stdout and "fitted: need_start" in out.stdout
    assert "| fixed 6 |" in out.stdout and "[26.9%]" in out.stdout
    assert "target (>= 13% fewer total GPU-h" in out.stdout
