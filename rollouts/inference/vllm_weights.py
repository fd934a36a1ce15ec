"""The receiving end of a policy pushed into vLLM's weights in place, on the GPU (rollouts.inference.weight_push).

vLLM imports this module in its worker process, by name, when the server was started with
`--weight-transfer-config '{"backend": "artweb_ipc"}'` (rollouts.inference.vllm_plugin registers the
name). vLLM's own "ipc" engine cannot be used: it imports Ray, which a GPU worker does not install, and its
HTTP form carries the handles as a pickle, which vLLM then only accepts with insecure deserialisation on.
Here each tensor is described by plain JSON (weight_push.tensor_handle), and nothing but the described
CUDA memory is opened.

Each update copies its tensors into the model's parameters through the model's own `load_weights`, so
fused layers (q/k/v, gate/up) take their shards as on a load from disk, the parameters keep their storage
(CUDA graphs captured on them stay valid), and a partial update leaves every other weight as it was. The
weights of a quantized model are not plain tensors: such a server refuses the update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rollouts.inference.weight_push import handle_fields

BACKEND = "artweb_ipc"


@dataclass
class SharedInit(WeightTransferInitInfo):
    pass


@dataclass
class SharedUpdate(WeightTransferUpdateInfo):
    names: list[str] = field(default_factory=list)
    tensors: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.tensors):
            raise ValueError(f"{len(self.names)} names for {len(self.tensors)} tensors")


class SharedWeightsEngine(WeightTransferEngine[SharedInit, SharedUpdate]):
    init_info_cls = SharedInit
    update_info_cls = SharedUpdate

    def init_transfer_engine(self, init_info: SharedInit) -> None:
        pass

    def start_weight_update(self) -> None:
        if self.model_config.quantization:
            raise ValueError(
                f"This server's weights are quantized ({self.model_config.quantization}); "
                "a policy cannot be copied into them in place."
            )

    def finish_weight_update(self) -> None:
        pass

    def receive_weights(self, update_info: SharedUpdate) -> None:
        device = self.device.index if self.device.index is not None else torch.cuda.current_device()
        here = str(torch.cuda.get_device_properties(device).uuid)
        pairs = zip(update_info.names, update_info.tensors, strict=True)
        self.model.load_weights([(name, shared_tensor(fields, here, device)) for name, fields in pairs])

    def shutdown(self) -> None:
        pass

    @staticmethod
    def trainer_send_weights(iterator, trainer_args) -> None:
        raise NotImplementedError("the trainer sends with rollouts.inference.weight_push.push")


def shared_tensor(fields: dict[str, Any], here: str, device: int) -> torch.Tensor:
    """The sender's tensor described by `fields`, opened on this process's `device` (whose GPU, by UUID,
    must be the sender's: CUDA IPC maps memory of the same card)."""
    if fields.get("gpu") != here:
        raise ValueError(f"The weights are on GPU {fields.get('gpu')}, this server on {here}: they must share a GPU.")
    return rebuild_cuda_tensor(*handle_fields(fields, device))
