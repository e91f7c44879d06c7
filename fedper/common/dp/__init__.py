"""User-level differential privacy for the base (DP-FedAvg, docs/PRIVACY.md): the clipping a
device applies, the noise the server adds, and the accounting of what a run spends."""
