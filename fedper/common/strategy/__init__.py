"""The round policy: what a round accepts, when it closes, how it aggregates and what it keeps.

One implementation that the server (:mod:`fedper.server`) and the simulation
(``fedper simulate``) both run: robust FedAvg is the base mode, DP-FedAvg and secure
aggregation are compositions of it, and :func:`~fedper.common.strategy.modes.round_strategy`
is the one place a run's mode is chosen. A new mode is written here once.
"""
