"""End-of-run plots (PNG) and a summary table from ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def _series(rows: list[dict[str, Any]], key: str, x: str) -> tuple[list[float], list[float]]:
    pts = [(r[x], r[key]) for r in rows if key in r and x in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(metrics: Path, out_dir: Path) -> list[Path]:
    """Write reward/accuracy vs step and vs time, throughput and wait-ratio plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(metrics)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for x, label in (("step", "trainer step"), ("elapsed", "seconds since start")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, name in (("reward_mean", "train reward (mean)"),
                          ("eval_accuracy", "held-out greedy accuracy")):
            xs, ys = _series(rows, key, x)
            if xs:
                ax.plot(xs, ys, marker="o" if key == "eval_accuracy" else None, ms=3, label=name)
        ax.set_xlabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title(f"reward and accuracy vs {label}")
        path = out_dir / f"reward_accuracy_vs_{x}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for key, name, fname in (("episodes_per_s", "rollout episodes/s", "throughput.png"),
                             ("wait_ratio", "trainer wait ratio", "wait_ratio.png")):
        xs, ys = _series(rows, key, "elapsed")
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(xs, ys)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def summary(metrics: Path) -> dict[str, Any]:
    """Headline numbers of a run: first/last/best eval accuracy, steps, time, throughput."""
    rows = read_jsonl(metrics)
    evals = [r for r in rows if "eval_accuracy" in r]
    steps = [r["step"] for r in rows if "step" in r]
    eps = [r["episodes_per_s"] for r in rows if r.get("episodes_per_s")]
    waits = [r["wait_ratio"] for r in rows if "wait_ratio" in r]
    return {
        "trainer_steps": max(steps, default=0),
        "elapsed_s": round(max((r.get("elapsed", 0) for r in rows), default=0.0), 1),
        "eval_first": evals[0]["eval_accuracy"] if evals else None,
        "eval_last": evals[-1]["eval_accuracy"] if evals else None,
        "eval_best": max((r["eval_accuracy"] for r in evals), default=None),
        "episodes_per_s_mean": round(sum(eps) / len(eps), 2) if eps else None,
        "wait_ratio_mean": round(sum(waits) / len(waits), 3) if waits else None,
    }
