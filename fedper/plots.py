"""PNG plots of a run: accuracy per evaluation point with the per-client spread (the last point,
marked, is the final evaluation after the last round), final accuracy per client."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import io

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedper.atomic_write import atomic_write_bytes
from fedper.results import RunRecorder

COLORS = {"fedper": "tab:blue", "fedavg": "tab:orange", "local": "tab:green"}
ACCURACY_PLOT = "accuracy_per_round.png"
CLIENT_PLOT = "final_accuracy_per_client.png"


def _save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def plot_run(recorder: RunRecorder, out: Path, title: str = "") -> list[Path]:
    """Write both plots into ``out``; returns their paths."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algorithm in recorder.algorithms:
        rows = [r for r in recorder.rounds(algorithm) if "accuracy" in r]
        rounds = np.array([r["round"] for r in rows])
        mean = np.array([r["accuracy"]["mean"] for r in rows])
        std = np.array([r["accuracy"]["std"] for r in rows])
        color = COLORS.get(algorithm)
        ax.plot(rounds, mean, label=algorithm, color=color, lw=2)
        ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.18, lw=0)
        final = [i for i, r in enumerate(rows) if r.get("final")]
        ax.plot(rounds[final], mean[final], "D", color=color, ms=6)
    ax.set_xlabel("round (diamond: the final evaluation, after the last round)")
    ax.set_ylabel("client accuracy (own test split,\nat the start of the round)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(title="mean ± std across clients")
    ax.set_title(title or "Accuracy per round")
    paths = [out / ACCURACY_PLOT, out / CLIENT_PLOT]
    _save(fig, paths[0])

    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * _num_clients(recorder) + 2), 4))
    n_alg = max(1, len(recorder.algorithms))
    width = 0.8 / n_alg
    for i, algorithm in enumerate(recorder.algorithms):
        per_client = recorder.final(algorithm).get("final_per_client", {})
        clients = np.array([int(c) for c in per_client])
        ax.bar(
            clients + (i - (n_alg - 1) / 2) * width,
            list(per_client.values()),
            width=width,
            label=algorithm,
            color=COLORS.get(algorithm),
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("client")
    ax.set_ylabel("final accuracy")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    points = {recorder.final(a).get("final_point", "") for a in recorder.algorithms}
    ax.set_title("Final accuracy per client" + (f" ({points.pop()})" if len(points) == 1 else ""))
    _save(fig, paths[1])
    return paths


def _num_clients(recorder: RunRecorder) -> int:
    return max((len(recorder.final(a).get("final_per_client", {})) for a in recorder.algorithms), default=1)
