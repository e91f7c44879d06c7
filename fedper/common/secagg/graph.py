"""Who shares with whom: SecAgg+'s random k-regular graph, or everyone (the 2017 protocol).

Bell et al. (CCS 2020) connect each device to k ~ log n others, in a random Harary graph: the
devices in a random order on a ring, each joined to the k/2 nearest on either side. The order is
drawn by the server from the OS's entropy, so no one picks whose neighbour they are.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

from fedper.common.errors import ConfigError


def default_neighbours(cohort: int) -> int:
    """k = 2 ceil(log2 n), at most n - 1: 10 of 20, 14 of 100, 20 of 1,000."""
    return min(cohort - 1, 2 * math.ceil(math.log2(max(cohort, 2))))


def default_threshold(neighbours: int) -> int:
    """A strict majority of the neighbours: the least t with 2t > k (see ``check_threshold``)."""
    return neighbours // 2 + 1


def check_threshold(neighbours: int, threshold: int) -> None:
    """2t > k: a server that tells half the neighbours a device dropped and the other half that
    it survived then cannot collect t shares of both of its secrets."""
    if not (2 * threshold > neighbours and threshold <= neighbours):
        raise ConfigError(
            f"the threshold must be more than half the neighbours and at most all: k={neighbours}, t={threshold}"
        )


def neighbour_graph(devices: Sequence[str], neighbours: int) -> dict[str, frozenset[str]]:
    """Each device's k neighbours (the relation is symmetric; k even, or n - 1 for everyone)."""
    n = len(devices)
    if len(set(devices)) != n:
        raise ConfigError("a device appears twice in the cohort")
    if not 1 <= neighbours <= n - 1:
        raise ConfigError(f"{n} devices can have 1 to {n - 1} neighbours each, not {neighbours}")
    if neighbours == n - 1:
        return {d: frozenset(devices) - {d} for d in devices}
    if neighbours % 2:
        raise ConfigError(f"a random k-regular graph of {n} devices needs an even k, got {neighbours}")
    ring = list(devices)
    for i in range(n - 1, 0, -1):  # Fisher-Yates with the OS's randomness
        j = secrets.randbelow(i + 1)
        ring[i], ring[j] = ring[j], ring[i]
    half = neighbours // 2
    return {ring[p]: frozenset(ring[(p + o) % n] for o in range(-half, half + 1) if o) for p in range(n)}
