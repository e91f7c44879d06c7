"""Secure aggregation (SecAgg+, Bell et al., CCS 2020; Bonawitz et al., CCS 2017): the server
learns only the sum of a cohort's base updates (docs/SECAGG.md). The pieces a device and the
server share: Shamir sharing, the keys and the channel between devices, the mask generator (AES-CTR), the
fixed-point encoding, the neighbour graph, and the two sides of a round."""
