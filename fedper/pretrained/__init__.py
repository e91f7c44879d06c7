"""The pretrained base the toolkit ships, and what ``--init`` names.

``aesthetic_synth_base.safetensors`` is ``fedper pretrain --out P --threads 1`` (its defaults:
20,000 unrated composites at 32 px, 8 epochs, seed 0) run at commit d12c47e; its model card,
``aesthetic_synth_base.json``, says what it was trained on (no rating, no taste) and how well.
It is committed rather than made on first use because the demo must run in minutes on a fresh
clone, and pretraining takes 6 of them on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

PRETRAINED = "pretrained"  # --init pretrained: the packaged base (MobileNet-V1 width 0.25, 32 px)
SCRATCH = "scratch"  # --init scratch: random initial weights
PACKAGED_BASE = Path(__file__).with_name("aesthetic_synth_base.safetensors")
PACKAGED_CARD = Path(__file__).with_name("aesthetic_synth_base.json")
INIT_HELP = (
    f"'{PRETRAINED}' (the packaged base pretrained on unrated aesthetic-synth photos: MobileNet-V1 width 0.25, "
    f"32 px), '{SCRATCH}' (random weights) or a checkpoint PATH (safetensors: fedper pretrain's base, timm's "
    "mobilenetv1_100 or torchvision's resnet34 layout); the head starts fresh"
)


def checkpoint_path(init: Path | None) -> Path | None:
    """The checkpoint file ``--init`` names, or None for random weights."""
    if init is None or str(init) == SCRATCH:
        return None
    if str(init) == PRETRAINED:
        return PACKAGED_BASE
    return init
