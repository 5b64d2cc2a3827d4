"""`astraflow compare RUN_A RUN_B`: two runs' held-out curves and train metrics, side by side.

Reads each directory's ``metrics.jsonl`` (a run's, or a counterfactual's from
`astraflow retrain`): the evaluation lines per policy and the trainer lines. Prints a markdown
table of held-out accuracy at every step both measured and of the train metrics' means, and
draws one picture: held-out accuracy against step (top) and the trainer's loss, clip fraction
and behaviour weight against step (bottom).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.core.errors import AstraflowError

#: train metrics compared (those both kinds of directory write)
TRAIN_KEYS = ("loss", "grad_norm", "clip_frac", "behav_weight_mean", "kl", "entropy")


@dataclass
class Curves:
    """One directory's evaluation and train metrics, per policy and step."""

    name: str
    evals: dict[str, dict[int, float]] = field(default_factory=dict)
    train: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)


def read(run_dir: str | Path) -> Curves:
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise AstraflowError(f"{run_dir}: no metrics.jsonl (not a run or retrain directory)")
    c = Curves(run_dir.name)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        policy, source = row.get("policy"), str(row.get("source", ""))
        if policy is None or "step" not in row:
            continue
        if "eval_accuracy" in row and source.startswith("evaluator"):
            c.evals.setdefault(policy, {})[int(row["step"])] = float(row["eval_accuracy"])
        elif source.startswith("trainer"):
            c.train.setdefault(policy, {})[int(row["step"])] = {
                k: float(row[k]) for k in TRAIN_KEYS if isinstance(row.get(k), int | float)}
    return c


def table(a: Curves, b: Curves) -> str:
    """Markdown: held-out accuracy per common step and policy, then the train metrics' means
    over the steps both have."""
    lines = []
    for p in sorted(set(a.evals) & set(b.evals)):
        lines += [f"held-out accuracy, {p}", "",
                  f"| step | {a.name} | {b.name} | difference |", "|---|---|---|---|"]
        for s in sorted(set(a.evals[p]) & set(b.evals[p])):
            x, y = a.evals[p][s], b.evals[p][s]
            lines.append(f"| {s} | {x:.3f} | {y:.3f} | {y - x:+.3f} |")
        lines.append("")
    for p in sorted(set(a.train) & set(b.train)):
        steps = sorted(set(a.train[p]) & set(b.train[p]))
        lines += [f"train metrics, {p}: mean over {len(steps)} common steps", "",
                  f"| metric | {a.name} | {b.name} |", "|---|---|---|"]
        for k in TRAIN_KEYS:
            xs = [a.train[p][s][k] for s in steps if k in a.train[p][s]]
            ys = [b.train[p][s][k] for s in steps if k in b.train[p][s]]
            if xs and ys:
                lines.append(f"| {k} | {statistics.fmean(xs):.4g} | {statistics.fmean(ys):.4g} |")
        lines.append("")
    if not lines:
        raise AstraflowError(f"{a.name} and {b.name} have no policy in common")
    return "\n".join(lines)


def plot(a: Curves, b: Curves, path: str | Path) -> Path:
    """The picture (PNG) at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = sorted((set(a.evals) & set(b.evals)) | (set(a.train) & set(b.train)))
    fig, axes = plt.subplots(2, max(1, len(policies)), figsize=(6 * max(1, len(policies)), 7),
                             squeeze=False)
    for col, p in enumerate(policies):
        top, bottom = axes[0][col], axes[1][col]
        for c, style in ((a, "-"), (b, "--")):
            ev = c.evals.get(p, {})
            if ev:
                xs = sorted(ev)
                top.plot(xs, [ev[s] for s in xs], style, marker="o", label=c.name)
            tr = c.train.get(p, {})
            xs = sorted(tr)
            for k in ("loss", "clip_frac", "behav_weight_mean"):
                pts = [(s, tr[s][k]) for s in xs if k in tr[s]]
                if pts:
                    bottom.plot(*zip(*pts, strict=True), style, label=f"{c.name} {k}")
        top.set(title=f"{p}: held-out accuracy", xlabel="step", ylabel="accuracy")
        bottom.set(title=f"{p}: train metrics", xlabel="step")
        top.legend(fontsize=8)
        bottom.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def compare(run_a: str | Path, run_b: str | Path, png: str | Path | None = None
            ) -> tuple[str, Path | None]:
    """(the markdown table, the picture's path or None)."""
    a, b = read(run_a), read(run_b)
    if a.name == b.name:
        a.name, b.name = f"A:{a.name}", f"B:{b.name}"
    text = table(a, b)
    return text, (plot(a, b, png) if png is not None else None)
