"""PNG plots of a run: accuracy per evaluation point with the per-client spread (the last point,
marked, is the final evaluation after the last round), final accuracy per client, and (with
held-out users) new users' accuracy against their number of rated photos."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")
import io

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedper.common.atomic_write import atomic_write_bytes


class RunView(Protocol):
    """What the plots read of a run (:class:`fedper.results.RunRecorder` is one), so the results
    module can draw its plots without the two importing each other."""

    new_users: dict[str, Any]

    @property
    def algorithms(self) -> list[str]: ...

    def rounds(self, algorithm: str) -> list[dict[str, Any]]: ...

    def final(self, algorithm: str) -> dict[str, Any]: ...


COLORS = {"fedper": "tab:blue", "fedavg": "tab:orange", "local": "tab:green"}
ACCURACY_PLOT = "accuracy_per_round.png"
CLIENT_PLOT = "final_accuracy_per_client.png"
NEW_USERS_PLOT = "new_users.png"
VARIANT_STYLES = {
    "fedper: head": ("tab:blue", "-"),
    "fedper: head+base": ("tab:blue", "--"),
    "fedavg: head": ("tab:orange", "-"),
    "scratch": ("tab:gray", ":"),
    "majority of N": ("black", ":"),
}


def _save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def plot_run(recorder: RunView, out: Path, title: str = "") -> list[Path]:
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
    if recorder.new_users:
        paths.append(out / NEW_USERS_PLOT)
        plot_new_users(recorder.new_users, paths[-1])
    return paths


def plot_new_users(new_users: dict[str, Any], path: Path) -> None:
    """Accuracy against N, one line per variant, the standard error of the mean shaded."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, curve in new_users["curves"].items():
        rows = [(int(n), r) for n, r in curve.items() if r["users"]]
        sizes = np.array([n for n, _ in rows])
        mean = np.array([r["mean"] for _, r in rows])
        se = np.array([r["se"] or 0.0 for _, r in rows])
        color, style = VARIANT_STYLES.get(name, (None, "-"))
        ax.plot(sizes, mean, style, marker="o", ms=4, label=name, color=color, lw=2)
        ax.fill_between(sizes, mean - se, mean + se, color=color, alpha=0.15, lw=0)
    ax.set_xscale("symlog", linthresh=5)  # N=0 and the small N apart, 100 still on the page
    ax.minorticks_off()
    covered: dict[str, Any] = next(iter(new_users["curves"].values()), {})
    ax.set_xticks([int(n) for n in covered])
    ax.set_xticklabels([f"{n}\n({r['users']})" for n, r in covered.items()])
    ax.set_xlabel("photos the new user rated, N (users covered)")
    ax.set_ylabel("accuracy on the new user's test split")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(title="mean ± s.e. across held-out users")
    ax.set_title(f"New users: fine-tuning on their first N photos ({new_users['steps']} steps each)")
    _save(fig, path)


def _num_clients(recorder: RunView) -> int:
    return max((len(recorder.final(a).get("final_per_client", {})) for a in recorder.algorithms), default=1)
