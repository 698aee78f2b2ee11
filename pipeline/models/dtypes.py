"""The precisions a model may run in, by the names grid files and CLIs use. Names only at
import time: grid files are validated without loading torch."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # grid name -> torch dtype name


def resolve_dtype(dtype: str) -> torch.dtype:
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return getattr(torch, DTYPES[dtype])
