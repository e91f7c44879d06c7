"""docs/img/synth_users.png: two aesthetic-synth users' photos, grouped by the rating each gave.

Usage: .venv/bin/python docs/scripts/data_figure.py [OUT_PNG]   (seed 0, users 0 and 1; ~5 s)
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fedper.data import aesthetic_synth as synth

PER_ROW = 6
USERS = (0, 1)


def main(out: Path) -> None:
    config = synth.SynthConfig(users=max(USERS) + 1, images_per_user=(200, 200), image_size=64, seed=0)
    everyone = synth.raters(config)
    fig, axes = plt.subplots(1, len(USERS), figsize=(6.2 * len(USERS), 6.4))
    for ax, user in zip(axes, USERS, strict=True):
        rater = everyone[user]
        r = synth.user_ratings(config, user, rater)
        canvas = np.full((5 * 66, PER_ROW * 66, 3), 255, dtype=np.uint8)
        for rating in range(5):
            picks = np.flatnonzero(r.labels == rating)[:PER_ROW]
            for col, i in enumerate(picks):
                canvas[rating * 66 : rating * 66 + 64, col * 66 : col * 66 + 64] = r.images[i]
        ax.imshow(canvas)
        ax.set_yticks([rating * 66 + 32 for rating in range(5)], [f"rated {c}" for c in synth.CLASSES])
        ax.set_xticks([])
        counts = np.bincount(r.labels, minlength=5)
        top = np.argsort(rater.content_mix)[::-1][:3]
        mix = ", ".join(f"{synth.CATEGORIES[c]} {rater.content_mix[c]:.0%}" for c in top)
        likes = np.argsort(rater.taste[: len(synth.LOOKS) + 1])
        ax.set_title(
            f"user {user}: ratings 1-5 given {counts.tolist()}\nphotographs {mix}\n"
            f"likes {synth.FEATURES[likes[-1]]}, dislikes {synth.FEATURES[likes[0]]}; "
            f"offset {rater.offset:+.2f}, spread {rater.spread:.2f}",
            fontsize=9,
        )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img/synth_users.png"))
