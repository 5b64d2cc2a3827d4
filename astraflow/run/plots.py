"""End-of-run plots (PNG) and a summary table from ``metrics.jsonl``: every policy's training
reward and evaluation curve, and the team's system accuracy (see run/collector.py for the
lines)."""

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


def _groups(rows: list[dict[str, Any]], key: str) -> dict[str | None, list[dict[str, Any]]]:
    """The rows carrying ``key``, by their ``policy`` (None: lines that name none), in order
    of first appearance."""
    out: dict[str | None, list[dict[str, Any]]] = {}
    for r in rows:
        if key in r and r[key] is not None:
            out.setdefault(r.get("policy"), []).append(r)
    return out


def curves(rows: list[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]], bool]]:
    """(key, legend, rows, marked) of every curve of the reward/accuracy plots: each policy's
    train reward and evaluation (answer or verdict accuracy), and the team's system accuracy.
    A run of one policy keeps the plain legends."""
    out = []
    for key, what, marked in (("reward_mean", "train reward (mean)", False),
                              ("eval_accuracy", "held-out greedy accuracy", True)):
        groups = _groups(rows, key)
        for policy, rs in groups.items():
            name = what
            if len(groups) > 1 or (policy is not None and key == "eval_accuracy"
                                   and rs[0].get("kind") == "verdict"):
                kind = " (balanced verdict accuracy)" if rs[0].get("kind") == "verdict" else ""
                name = f"{policy}: {what}{kind}"
            out.append((key, name, rs, marked))
    for key, name in (("system_accuracy", "team: system accuracy (after verdict and retry)"),
                      ("first_accuracy", "team: solver's first answer")):
        rs = [r for r in rows if r.get(key) is not None]
        if rs:
            out.append((key, name, rs, True))
    return out


def plot_run(metrics: Path, out_dir: Path) -> list[Path]:
    """Write reward/accuracy vs step and vs time, throughput and wait-ratio plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(metrics)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    lines = curves(rows)
    for x, label in (("step", "trainer step"), ("elapsed", "seconds since start")):
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for key, name, rs, marked in lines:
            xs, ys = _series(rs, key, x)
            if xs:
                ax.plot(xs, ys, marker="o" if marked else None, ms=3, label=name)
                drawn += 1
        ax.set_xlabel(label if x == "elapsed" else
                      f"{label} (evaluations: weight version; team: the solver's)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if drawn:  # a run stopped before its first step has nothing to label
            ax.legend(loc="lower right", fontsize="small")
        ax.set_title(f"reward and accuracy vs {label}")
        path = out_dir / f"reward_accuracy_vs_{x}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for key, name, fname in (("episodes_per_s", "rollout episodes/s", "throughput.png"),
                             ("wait_ratio", "trainer wait ratio", "wait_ratio.png")):
        fig, ax = plt.subplots(figsize=(7, 3))
        groups = _groups(rows, key) if key == "wait_ratio" else {None: rows}
        for policy, rs in groups.items():
            xs, ys = _series(rs, key, "elapsed")
            ax.plot(xs, ys, label=policy if len(groups) > 1 else None)
        if len(groups) > 1:
            ax.legend(loc="upper right", fontsize="small")
        ax.set_xlabel("seconds since start")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _first_last_best(values: list[float]) -> dict[str, Any]:
    return {"first": values[0] if values else None, "last": values[-1] if values else None,
            "best": max(values, default=None)}


def summary(metrics: Path) -> dict[str, Any]:
    """Headline numbers of a run: first/last/best eval accuracy, steps, time, throughput.

    ``eval_first``/``eval_last``/``eval_best`` are those of the first policy evaluated on its
    answers (a run of one policy: its evaluator, as ever). With evaluation lines that name
    policies, ``eval`` holds every policy's (``kind``, ``first``, ``last``, ``best``, ``n``;
    a verifier's also its last ``right``/``wrong`` halves), and ``system`` the team's
    (``first``/``last``/``best`` system accuracy, the last ``first_accuracy``, ``retry_rate``
    and ``versions``)."""
    rows = read_jsonl(metrics)
    evals = [r for r in rows if "eval_accuracy" in r]
    by_policy = _groups(evals, "eval_accuracy")
    answers = [rs for rs in by_policy.values() if rs[0].get("kind", "answer") == "answer"]
    primary = answers[0] if answers else evals
    steps = [r["step"] for r in rows if "step" in r]
    eps = [r["episodes_per_s"] for r in rows if r.get("episodes_per_s")]
    waits = [r["wait_ratio"] for r in rows if "wait_ratio" in r]
    out: dict[str, Any] = {
        "trainer_steps": max(steps, default=0),
        "elapsed_s": round(max((r.get("elapsed", 0) for r in rows), default=0.0), 1),
        "eval_first": primary[0]["eval_accuracy"] if primary else None,
        "eval_last": primary[-1]["eval_accuracy"] if primary else None,
        "eval_best": max((r["eval_accuracy"] for r in primary), default=None),
        "episodes_per_s_mean": round(sum(eps) / len(eps), 2) if eps else None,
        "wait_ratio_mean": round(sum(waits) / len(waits), 3) if waits else None,
        # start-up: RL-phase seconds until a trainer reported its first trained version
        "first_version_s": min((r["elapsed"] for r in rows if "wait_ratio" in r
                                and r.get("step", 0) >= 1 and "elapsed" in r), default=None),
    }
    trained = {p: max(r["step"] for r in rs)
               for p, rs in _groups(rows, "reward_mean").items() if p is not None}
    if trained:
        out["trainer_steps_by_policy"] = trained
    named = {p: rs for p, rs in by_policy.items() if p is not None}
    if named:
        out["eval"] = {}
        for p, rs in named.items():
            entry = {"kind": rs[-1].get("kind", "answer"),
                     **_first_last_best([r["eval_accuracy"] for r in rs]), "n": len(rs),
                     "last_step": rs[-1].get("step")}
            if entry["kind"] == "verdict":
                entry["right"] = rs[-1].get("eval_right_accuracy")
                entry["wrong"] = rs[-1].get("eval_wrong_accuracy")
            out["eval"][p] = entry
    team = [r for r in rows if r.get("system_accuracy") is not None]
    if team:
        out["system"] = {**_first_last_best([r["system_accuracy"] for r in team]),
                         "n": len(team), "first_accuracy": team[-1].get("first_accuracy"),
                         "retry_rate": team[-1].get("retry_rate"),
                         "versions": team[-1].get("versions")}
        out["system_accuracy_last"] = out["system"]["last"]
    return out
