"""ExecuTorch ``.ptd`` weight files written from named tensors (what a device does each round)."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def encode_ptd(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """Serialize named tensors into a FlatTensor ``.ptd`` the runtime can load beside a program."""
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.exir.tensor_layout import TensorLayout
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    buffers: list[bytes] = []
    entries: dict[str, DataEntry] = {}
    for name, tensor in tensors.items():
        t = tensor.detach().contiguous().cpu()
        entries[name] = DataEntry(buffer_index=len(buffers), alignment=16, tensor_layout=TensorLayout.from_tensor(t))
        buffers.append(t.numpy().tobytes())
    cord: Cord = FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=entries))
    return bytes(cord)
