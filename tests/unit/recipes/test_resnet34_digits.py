"""make resnet34-digits' table of the rounds on the way, from the runs' metrics.csv."""

from __future__ import annotations

from pathlib import Path

from fedper._recipes.resnet34_digits import per_round_table


def _run(root: Path, accuracies: dict[tuple[str, int, int], float]) -> Path:
    root.mkdir()
    rows = ["algorithm,round,client,num_samples,accuracy,accuracy_after,train_loss,final"]
    rows += [f"{a},{r},{c},10,{v},,,False" for (a, r, c), v in accuracies.items()]
    (root / "metrics.csv").write_text("\n".join(rows) + "\n")
    return root


def test_each_round_gives_the_seeds_means_and_the_paired_per_client_difference(tmp_path: Path) -> None:
    # Two seeds, two clients: FedPer ahead by 0.2 and 0.4 on seed 0, level and behind by 0.1 on seed 1.
    seed0 = _run(
        tmp_path / "s0", {("fedper", 5, 0): 0.6, ("fedper", 5, 1): 0.8, ("fedavg", 5, 0): 0.4, ("fedavg", 5, 1): 0.4}
    )
    seed1 = _run(
        tmp_path / "s1", {("fedper", 5, 0): 0.5, ("fedper", 5, 1): 0.5, ("fedavg", 5, 0): 0.5, ("fedavg", 5, 1): 0.6}
    )
    table = per_round_table([seed0, seed1], rounds=(5,))
    row = table.splitlines()[2]
    # fedper: seed means 0.7 and 0.5; fedavg: 0.4 and 0.55; differences 0.2, 0.4, 0.0, -0.1 (mean 0.125,
    # sample std 0.2217, SE 0.1109), 2 won and 1 lost.
    assert row == "| 5 | 0.600 ± 0.100 | 0.475 ± 0.075 | +0.125 ± 0.111 (2 won / 1 lost of 4) |"
