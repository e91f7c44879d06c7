"""The model zoo and the FedPer base/head split."""

from fedper.models.config import MODEL_NAMES, ModelConfig, build_model
from fedper.models.split import ModelSplit, exchanged_names, exchanged_state, max_kp, split
from fedper.models.staged import StagedModel

__all__ = [
    "MODEL_NAMES",
    "ModelConfig",
    "ModelSplit",
    "StagedModel",
    "build_model",
    "exchanged_names",
    "exchanged_state",
    "max_kp",
    "split",
]
