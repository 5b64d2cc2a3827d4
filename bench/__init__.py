"""Benchmarks (each run as a module from the repository root: ``python -m bench.<name>``) and
their shared tooling (:mod:`bench.lib`).

A package so that the scripts import one another and :mod:`bench.lib` as ``bench.…``, and the
tests import them too (``pythonpath`` in pyproject.toml's pytest section puts the root on the
import path); nothing under ``astraflow/`` imports it.
"""
