"""A transformers model in CTranslate2's form: its model spec, converted in memory, and the spec's
model.bin written from the weights' own memory (rollouts.inference.ct2_engine loads both)."""

from __future__ import annotations

import copy
import itertools


def convert(model, tokenizer, compute_type: str):
    """CTranslate2's model spec of a transformers model, validated and in compute_type."""
    from ctranslate2.converters.transformers import _MODEL_LOADERS

    loader = _MODEL_LOADERS.get(type(model.config).__name__)
    if loader is None:
        raise ValueError(f"CTranslate2 cannot convert {type(model.config).__name__} models")
    # The converter takes the module tree apart as it goes (it deletes each layer's attention and MLP once
    # converted) but never changes a tensor: it gets a copy of the tree that shares them.
    tensors = itertools.chain(model.parameters(), model.buffers())
    spec = loader(copy.deepcopy(model, {id(t): t for t in tensors}), tokenizer)
    spec.validate()
    spec.optimize(quantization=compute_type)
    return spec


# CTranslate2's model.bin, version 6 (what ctranslate2 4.x reads and writes): a header, then each
# variable's name, shape, type and bytes, then the aliases (a variable stored once under two names).
# Little-endian, as the library writes it on x86 and ARM.
_BINARY_VERSION = 6
_TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}


def write_model_bin(spec, fh) -> None:
    """Write spec's model.bin to the binary file fh, byte for byte what `spec.save` writes, with each
    weight's bytes handed to the file from the weight's own memory (no copy in between)."""
    import struct

    import numpy as np
    import torch

    def text(value: str) -> bytes:
        raw = value.encode("utf-8")
        return struct.pack("<H", len(raw) + 1) + raw + b"\0"

    variables, aliases = [], []
    for name, value in spec.variables(ordered=True):
        (aliases if isinstance(value, str) else variables).append((name, value))
    fh.write(struct.pack("<I", _BINARY_VERSION) + text(spec.name) + struct.pack("<II", spec.revision, len(variables)))
    for name, value in variables:
        tensor = getattr(value, "tensor", None)  # torch tensors stay torch tensors through the conversion
        if tensor is not None:
            data = tensor.contiguous().view(-1).view(torch.uint8).numpy()
        else:
            data = np.ascontiguousarray(value.numpy()).reshape(-1).view(np.uint8)
        shape = list(value.shape)
        fh.write(
            text(name)
            + struct.pack(f"<B{len(shape)}I", len(shape), *shape)
            + struct.pack("<BI", _TYPE_IDS[value.dtype], data.nbytes)
        )
        fh.write(memoryview(data))
    fh.write(struct.pack("<I", len(aliases)))
    for alias, name in aliases:
        fh.write(text(alias) + text(name))
