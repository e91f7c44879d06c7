"""The layer groups kp counts over, as a table (``fedper export --list-layers``): what a user reads
to choose ``--kp`` or ``--head-modules`` for a model the toolkit did not define."""

from __future__ import annotations

from dataclasses import dataclass

from fedper.models.split import group_parameters
from fedper.models.staged import StagedModel


@dataclass(frozen=True)
class LayerRow:
    index: int  # 0 = the bottom layer
    kp: int | None  # the kp whose head starts at this layer (None: no kp can, e.g. the bottom one)
    modules: tuple[str, ...]  # module paths (state-key prefixes)
    parameters: int  # number of trainable values


def layer_rows(model: StagedModel) -> list[LayerRow]:
    """One row per layer group, bottom to top, with the kp that makes it the lowest personal layer."""
    groups = model.layer_groups()
    sizes = dict(model.named_parameters())
    counts = [sum(sizes[n].numel() for n in names) for names in group_parameters(model)]
    n = len(groups)
    rows = []
    for i, (group, count) in enumerate(zip(groups, counts, strict=True)):
        kp: int | None = n - i if i > 0 else None
        if model.head_modules:
            kp = 1 if i == n - 1 else None
        rows.append(LayerRow(i, kp, tuple(group), count))
    return rows


def format_layers(model: StagedModel, name: str) -> str:
    """The table :func:`layer_rows` gives, as text."""
    rows = layer_rows(model)
    classifier = model.classifier_name()
    if model.head_modules:
        title = (f"{name}: {len(rows)} layer groups, bottom to top; the personal head is --head-modules "
                 f"{','.join(model.head_modules)} (the top row), whatever kp >= 1")  # fmt: skip
    else:
        title = f"{name}: {len(rows)} layer groups, bottom to top; --kp K makes the top K personal (kp 0: FedAvg)"
    lines = [title, f"{'index':>5}  {'kp':>3}  {'parameters':>11}  modules"]
    for row in rows:
        marks = " (classifier)" if any(classifier == p or classifier.startswith(p + ".") for p in row.modules) else ""
        kp = "-" if row.kp is None else str(row.kp)
        lines.append(f"{row.index:>5}  {kp:>3}  {row.parameters:>11,}  {', '.join(row.modules)}{marks}")
    total = sum(r.parameters for r in rows)
    lines.append(f"{'':>5}  {'':>3}  {total:>11,}  in all")
    return "\n".join(lines)
