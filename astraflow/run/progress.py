"""Progress without a terminal: one plain line every ``launch.progress_every_s`` seconds while
`astraflow run` has no live view to draw (stdout not a terminal, or ``--no-live``).

The numbers are the live view's (:mod:`astraflow.run.view`), ``-`` where none is measured yet;
the fields are described in docs/cli.md. A line looks like::

    progress rl 1m05s step 12/50 reward 0.412 accuracy 0.360 episodes/s 8.20 wait 0.31 lag 14
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any


def _num(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{float(v):.{digits}f}"


def elapsed(seconds: float) -> str:
    """``1m05s``, ``42s``, ``2h03m``: the run's age as the line shows it."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Ticker:
    """Emits ``line()`` at most once every ``every_s`` seconds (the first at the first tick);
    ``every_s`` None: never. Writes plain text to ``stream`` (stdout), flushed: no colour, no
    wrapping, one line per tick, readable in a log file and by ``grep``."""

    def __init__(self, every_s: float | None, stream: IO[str] | None = None) -> None:
        self.every_s = every_s
        self.stream = stream
        self.lines = 0
        self._last: float | None = None

    def tick(self, line: Callable[[], str], *, force: bool = False) -> None:
        if self.every_s is None:
            return
        now = time.monotonic()
        if not force and self._last is not None and now - self._last < self.every_s:
            return
        self._last = now
        stream = self.stream or sys.stdout
        stream.write(f"progress {line()}\n")
        stream.flush()
        self.lines += 1


def policy_fields(step: Any, max_steps: int | None, reward: Any, accuracy: Any,
                  wait: Any) -> str:
    """One policy's part of a line: step (of its budget), reward, held-out accuracy, wait."""
    budget = f"/{max_steps}" if max_steps else ""
    return (f"step {'-' if step is None else int(step)}{budget} reward {_num(reward)} "
            f"accuracy {_num(accuracy)} wait {_num(wait, 2)}")


def rl_line(col: Any, config: Any, lags: Mapping[str, int], started: float) -> str:
    """The RL phase's line from the collector ``col`` (what the live view reads)."""
    trainers = col.newest_by_policy("trainer")
    evals = col.evaluators()
    parts = []
    for p in config.policies:
        t = trainers.get(p)
        g = t.metric.gauges if t is not None else {}
        e = evals.get(p)
        acc = e.metric.gauges.get("eval_accuracy") if e is not None else None
        text = policy_fields(g.get("step"), config.trainer_for(p).max_steps,
                             g.get("reward_mean"), acc, g.get("wait_ratio"))
        parts.append(text if len(config.policies) == 1 else f"policy {p}: {text};")
    team = col.team_evaluator()
    if team is not None and "system_accuracy" in team.metric.gauges:
        parts.append(f"team accuracy {_num(team.metric.gauges['system_accuracy'])};")
    eps, _ = col.rollout_rates()
    lag = sum(lags.values()) if lags else None
    return (f"rl {elapsed(time.time() - started)} {' '.join(parts)} episodes/s {eps:.2f} "
            f"lag {'-' if lag is None else lag}")


def warmup_line(started: float, policies: Sequence[tuple[str, Any, int | None, Any]]) -> str:
    """The SFT warm-up's line: per policy (name, trainer step, step cap, newest held-out
    accuracy); SFT has no reward, episodes nor lag."""
    parts = []
    for name, step, cap, acc in policies:
        budget = f"/{cap}" if cap else ""
        text = (f"step {'-' if step is None else int(step)}{budget} "
                f"accuracy {_num(acc)}")
        parts.append(text if len(policies) == 1 else f"policy {name}: {text};")
    return f"warm-up {elapsed(time.time() - started)} {' '.join(parts)}"
