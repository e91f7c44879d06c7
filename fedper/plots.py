"""PNG plots of a run: accuracy per evaluation point with the per-client spread (the last point,
marked, is the final evaluation after the last round), final accuracy per client, and (with
held-out users) new users' accuracy against their number of rated photos."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import io

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedper.common.atomic_write import atomic_write_bytes
from fedper.run_results import NewUsers, RunResults

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


def plot_run(results: RunResults, out: Path, title: str = "") -> list[Path]:
    """Write the plots of a run's results into ``out`` (the new users' only if it has them);
    returns their paths. Whatever the results hold draws: an algorithm with no evaluation point
    is in the legend with no line, an empty run gives empty axes."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algorithm, all_rows in results.rounds.items():
        rows = [(r.round, r.accuracy, r.final) for r in all_rows if r.accuracy is not None]
        rounds = np.array([r for r, _, _ in rows], dtype=float)
        mean = np.array([a.mean for _, a, _ in rows])
        std = np.array([a.std for _, a, _ in rows])
        color = COLORS.get(algorithm)
        ax.plot(rounds, mean, label=algorithm, color=color, lw=2)
        ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.18, lw=0)
        final = [i for i, (_, _, is_final) in enumerate(rows) if is_final]
        ax.plot(rounds[final], mean[final], "D", color=color, ms=6)
    ax.set_xlabel("round (diamond: the final evaluation, after the last round)")
    ax.set_ylabel("client accuracy (own test split,\nat the start of the round)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if results.rounds:
        ax.legend(title="mean ± std across clients")
    ax.set_title(title or "Accuracy per round")
    paths = [out / ACCURACY_PLOT, out / CLIENT_PLOT]
    _save(fig, paths[0])

    finals = results.algorithms
    clients_shown = max((len(f.final_per_client) for f in finals.values()), default=1)
    fig, ax = plt.subplots(figsize=(min(40.0, max(6.0, 0.45 * clients_shown + 2)), 4))
    width = 0.8 / max(1, len(finals))
    for i, (algorithm, summary) in enumerate(finals.items()):
        per_client = summary.final_per_client
        clients = np.array([int(c) for c in per_client], dtype=float)
        ax.bar(clients + (i - (len(finals) - 1) / 2) * width, list(per_client.values()), width=width,
               label=algorithm, color=COLORS.get(algorithm))  # fmt: skip
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("client")
    ax.set_ylabel("final accuracy")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    if finals:
        ax.legend()
    points = {f.final_point for f in finals.values()}
    ax.set_title("Final accuracy per client" + (f" ({points.pop()})" if len(points) == 1 else ""))
    _save(fig, paths[1])
    if results.new_users is not None:
        paths.append(out / NEW_USERS_PLOT)
        plot_new_users(results.new_users, paths[-1])
    return paths


def plot_new_users(new_users: NewUsers, path: Path) -> None:
    """Accuracy against N, one line per variant, the standard error of the mean shaded (none
    where fewer than two users had N photos)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes_seen: dict[int, int] = {}
    for name, curve in new_users.curves.items():
        rows = sorted((int(n), p) for n, p in curve.items() if p.mean is not None)
        for n, p in curve.items():
            sizes_seen[int(n)] = max(sizes_seen.get(int(n), 0), p.users)
        sizes = np.array([n for n, _ in rows], dtype=float)
        mean = np.array([p.mean for _, p in rows], dtype=float)
        se = np.array([p.se or 0.0 for _, p in rows])
        color, style = VARIANT_STYLES.get(name, (None, "-"))
        ax.plot(sizes, mean, style, marker="o", ms=4, label=name, color=color, lw=2)
        ax.fill_between(sizes, mean - se, mean + se, color=color, alpha=0.15, lw=0)
    ax.set_xscale("symlog", linthresh=5)  # N=0 and the small N apart, 100 still on the page
    ax.minorticks_off()
    ticks = sorted(sizes_seen)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{n}\n({sizes_seen[n]})" for n in ticks])
    ax.set_xlabel("photos the new user rated, N (users covered)")
    ax.set_ylabel("accuracy on the new user's test split")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if new_users.curves:
        ax.legend(title="mean ± s.e. across held-out users")
    ax.set_title(f"New users: fine-tuning on their first N photos ({new_users.steps} steps each)")
    _save(fig, path)
