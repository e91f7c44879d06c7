"""fedper: personalized federated learning (FedPer) for on-device models.

The shared core: model zoo and base/head split, weights I/O, datasets and
partitioners, FedAvg aggregation, metrics and the ``fedper`` command line.
"""

__version__ = "0.1.0"
