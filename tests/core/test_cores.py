"""Cores shared by the compute roles of one host (astraflow/core/cores.py): an idle role lends
its share, a busy one keeps it, a dead one frees it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from astraflow.core.cores import ENV, CoreShare, env_value, from_env, parse_env
from astraflow.core.errors import ConfigError


def share(folder, name, cores=2, own=1, **kw):
    seen: list[int] = []
    s = CoreShare(folder, name, cores=cores, share=own, every_s=0.0,
                  set_threads=seen.append, **kw)
    return s, seen


def test_alone_takes_every_core_and_a_busy_peer_takes_its_share_back(tmp_path):
    trainer, t_threads = share(tmp_path, "trainer-default")
    worker, w_threads = share(tmp_path, "rollout-0")
    with trainer.busy():  # the worker is idle: its core is lent
        assert t_threads[-1] == 2
        with worker.busy():  # both busy: each its own share
            assert w_threads[-1] == 1
            trainer._peers_at = -1.0  # (peers are cached for a second)
            assert trainer.adjust() == 1
        assert trainer.adjust() == 2  # the worker went idle: the core comes back
    assert trainer.changes == 3  # unset → 2 → 1 → 2
    trainer.close()
    worker.close()


def test_busy_is_reentrant_and_released(tmp_path):
    a, _ = share(tmp_path, "a")
    b, b_threads = share(tmp_path, "b")
    with a.busy():
        with a.busy():
            pass
        assert [p.name for p in b.busy_peers()] == ["a"]  # still busy after the inner block
    assert b.busy_peers() == []
    with b.busy():
        assert b_threads[-1] == 2


def test_shares_larger_than_one_and_more_roles_than_cores(tmp_path):
    t, t_threads = share(tmp_path, "t", cores=8, own=4)
    w, _ = share(tmp_path, "w", cores=8, own=4)
    with w.busy(), t.busy():
        assert t_threads[-1] == 4
    with t.busy():
        assert t_threads[-1] == 8
    # three roles on two cores: nobody ever gets fewer than its share of 1
    x, x_threads = share(tmp_path / "three", "x")
    y, _ = share(tmp_path / "three", "y")
    z, _ = share(tmp_path / "three", "z")
    with y.busy(), z.busy(), x.busy():
        assert x_threads[-1] == 1


def test_a_killed_peer_frees_its_cores(tmp_path):
    """A peer in another process holds its busy lock; SIGKILL drops it (the kernel releases
    the flock) and this role takes the whole machine at its next check."""
    code = textwrap.dedent(f"""
        import sys, time
        from astraflow.core.cores import CoreShare
        s = CoreShare({str(tmp_path)!r}, "rollout-0", cores=2, share=1,
                      set_threads=lambda n: None)
        s.enter()
        print("busy", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "busy"
        trainer, threads = share(tmp_path, "trainer-default")
        with trainer.busy():
            assert threads[-1] == 1  # the other process computes
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            deadline = time.monotonic() + 10
            while trainer.adjust() != 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert threads[-1] == 2
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_adjust_is_rate_limited_but_a_busy_start_always_sets(tmp_path):
    seen: list[int] = []
    s = CoreShare(tmp_path, "t", cores=2, share=1, every_s=3600.0, set_threads=seen.append)
    with s.busy():
        pass
    with s.busy():  # a new busy stretch sets the threads again (maybe another thread)
        pass
    assert seen == [2, 2]
    s.adjust()
    assert seen == [2, 2]  # within every_s: nothing asked again


def test_env_round_trip_and_errors(tmp_path):
    value = env_value(tmp_path / "cores", 4, 2)
    assert parse_env(value) == (tmp_path / "cores", 4, 2)
    s = from_env("trainer-x", env={ENV: value}, set_threads=lambda n: None)
    assert s is not None and s.share == 2 and s.cores == 4
    s.close()
    assert from_env("trainer-x", env={}) is None
    for bad in ("nocolon", f"{tmp_path}:2:3", f"{tmp_path}:x:1", f"{tmp_path}:0:0"):
        with pytest.raises(ConfigError, match=ENV):
            parse_env(bad)
    with pytest.raises(ConfigError, match="not in 1..2"):
        CoreShare(tmp_path, "t", cores=2, share=3)


def test_a_lender_keeps_its_threads_and_lends_its_share_while_idle(tmp_path):
    """The trainer lends and never borrows: its thread count (and so the order of its kernels'
    sums) is the same whoever else is busy, while a worker takes its core when it waits."""
    trainer, t_threads = share(tmp_path, "trainer-default", borrow=False)
    worker, w_threads = share(tmp_path, "rollout-0")
    with worker.busy():
        assert w_threads[-1] == 2  # the trainer waits for a batch: its core is lent
        with trainer.busy():
            assert trainer.adjust() == 0 and t_threads == []  # never set by the budget
            assert worker.adjust() == 1  # the trainer is busy: its share comes back
        assert worker.adjust() == 2
    assert t_threads == []
