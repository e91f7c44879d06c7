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


def decode_ptd(data: bytes) -> dict[str, torch.Tensor]:
    """Read every float32 tensor of a ``.ptd`` back (for tests and inspection)."""
    import numpy as np
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(data))
    out: dict[str, torch.Tensor] = {}
    for name, entry in payload.named_data.items():
        layout = entry.tensor_layout
        if layout is None:
            continue
        raw = bytes(payload.buffers[entry.buffer_index])
        n = int(np.prod(layout.sizes)) if layout.sizes else 1
        arr = np.frombuffer(raw, dtype=np.float32, count=n).reshape(layout.sizes)
        out[name] = torch.from_numpy(arr.copy())
    return out
