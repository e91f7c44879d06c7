"""docs/PRIVACY.md, "What a run spends": the noise multiplier each epsilon needs.

For a population of N devices, an expected cohort of n a round (each device drawn with
probability q = n/N) and R rounds, the smallest noise multiplier z (to 0.01) whose epsilon at
delta = N^-1.1 is at most the target, by the toolkit's accountant (fedper.common.dp.accountant,
RDP); the PLD accountant's epsilon for that z beside it, and the noise's norm on the mean of a
round against the clip, for the base of the demo's model.

Usage: .venv/bin/python docs/scripts/dp_budgets.py   (about a minute)
"""

from __future__ import annotations

import math

import dp_accounting

from fedper.common.dp.accountant import epsilon, run_event, smallest_noise_multiplier
from fedper.models import ModelConfig, build_model, exchanged_state, split

POPULATION, COHORT = 1000, 100
TARGETS = (8.0, 4.0, 2.0)
ROUNDS = (20, 50)


def base_coordinates() -> int:
    """The floats of the demo's base: MobileNet-V1 width 0.25 at 32 px, ordinal head, kp=1."""
    model = build_model(ModelConfig(name="mobilenet_v1", num_classes=5, alpha=0.25, input_size=32, head="ordinal"))
    state = exchanged_state(model)
    return sum(state[name].numel() for name in split(model, 1).base)


def main() -> None:
    q, delta = COHORT / POPULATION, POPULATION**-1.1
    coordinates = base_coordinates()
    print(f"N = {POPULATION}, expected cohort {COHORT} (q = {q}), delta = {delta:.3g}, base of {coordinates} floats")
    print("| rounds | target epsilon | noise multiplier z | epsilon (RDP, reported) | epsilon (PLD) "
          "| noise norm on the mean / C |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for rounds in ROUNDS:
        for target in TARGETS:
            z = smallest_noise_multiplier(target, q, rounds, delta)
            pld = dp_accounting.pld.PLDAccountant()
            pld.compose(run_event(z, q, rounds))
            noise = z * math.sqrt(coordinates) / COHORT
            print(f"| {rounds} | {target:g} | {z:.2f} | {epsilon(z, q, rounds, delta):.3f} | "
                  f"{pld.get_epsilon(delta):.3f} | {noise:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
