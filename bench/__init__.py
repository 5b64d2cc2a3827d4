"""Benchmarks (run as scripts: ``python bench/<name>.py``) and their tooling (:mod:`bench.lib`).

A package only so that ``bench.lib`` is importable from the scripts (each puts the repository
root on ``sys.path``) and from the tests (``pythonpath`` in pyproject.toml's pytest section);
nothing under ``astraflow/`` imports it.
"""
