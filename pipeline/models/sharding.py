"""A target too large for one GPU, spread layer by layer over the GPUs its actor holds.

Qwen2.5-VL-72B or InternVL3-78B with a draft need about 155 GB; no single GPU holds that. An
actor given several GPUs (a grid pair's `gpus: 2`) loads its drafts on the first GPU, then the
target over all of them through transformers' `device_map`: accelerate's hooks move each
layer's inputs to its GPU and the logits back to the first one, and each layer's KV cache
lives beside the layer. The map is planned on an empty (meta) model before any weight loads,
so a target that would not fit is refused with the sizes, not after minutes of loading, and
never half offloaded to CPU or disk (which would make every timing meaningless).

The map is balanced (accelerate's `get_balanced_memory`): every GPU keeps a like share of the
layers, so of the KV cache, within its budget: its free memory after the drafts, less
`HEADROOM` for caches and activations. The modules that read the prompt (vision tower,
projector, token embeddings) come first in every family's module order, so they land on the
first GPU beside the drafts; the plan checks that they did.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import PretrainedConfig, PreTrainedModel

HEADROOM = 0.2  # of each GPU's free memory kept for KV caches and activations


class DoesNotFit(ValueError):
    """The target cannot be spread over the GPUs given to it."""


def gpu_budgets(gpus: int, headroom: float = HEADROOM) -> dict[int, int]:
    """Bytes the target may take on each of the first `gpus` GPUs: what is free now (the drafts
    already loaded), less `headroom` of it."""
    return {i: int(torch.cuda.mem_get_info(i)[0] * (1 - headroom)) for i in range(gpus)}


def empty_model(model_class: type, config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    """The model's modules with meta weights (no memory): what a device map is planned on."""
    from accelerate import init_empty_weights  # imported only where a model loads on a GPU

    build = getattr(model_class, "from_config", None) or model_class._from_config  # Auto* or a model class
    with init_empty_weights():
        return build(config, dtype=dtype)


def check_fits_one_gpu(model: PreTrainedModel, free: int, name: str) -> None:
    """Refuse `model` (an `empty_model`) whose weights alone exceed the `free` bytes of its one
    GPU, before its weights are read (loading them first would fill host memory, then fail)."""
    from accelerate.utils import compute_module_sizes

    size = compute_module_sizes(model)[""]
    if size > free:
        raise DoesNotFit(f"{name} ({_gb(size)} GB in {_dtype(model)}) does not fit on one GPU "
                         f"({_gb(free)} GB free): give its pair more GPUs (`gpus:` in the grid)")


def plan_device_map(model: PreTrainedModel, budgets: dict[int, int], name: str) -> dict[str, int]:
    """Module name -> GPU index for `model` (an `empty_model`), balanced over `budgets` (GPU index
    -> bytes), with the prompt-reading modules on GPU 0. Raises `DoesNotFit` naming the sizes."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes, get_balanced_memory

    no_split = model._no_split_modules
    balanced = get_balanced_memory(model, max_memory=dict(budgets), no_split_module_classes=no_split)
    placement = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split)
    if any(not isinstance(device, int) for device in placement.values()):
        size = compute_module_sizes(model)[""]
        free = " + ".join(_gb(budget) for budget in budgets.values())
        raise DoesNotFit(f"{name} ({_gb(size)} GB in {_dtype(model)}) does not fit "
                         f"on {len(budgets)} GPUs: {free} GB are left for it after the drafts and "
                         f"{HEADROOM:.0%} headroom for caches; give its pair more GPUs (`gpus:` in the grid)")
    entries = list(placement)
    embeddings = _module_name(model, model.get_input_embeddings())
    last = next(i for i, entry in enumerate(entries)
                if embeddings == entry or embeddings.startswith(entry + "."))
    ahead = [entry for entry in entries[: last + 1] if placement[entry] != 0]
    if ahead:
        raise DoesNotFit(f"{name}: the modules that read the prompt would not all sit on the first GPU "
                         f"({', '.join(ahead)} would not); give GPU 0 more room")
    return dict(placement)


def _dtype(model: PreTrainedModel) -> str:
    return str(model.dtype).removeprefix("torch.")


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f}" if size >= 1e8 else f"{size / 1e9:.4f}"


def _module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(name for name, candidate in model.named_modules() if candidate is module)


def on_devices(tensor: torch.Tensor) -> Callable[[torch.device], torch.Tensor]:
    """`tensor` on a given device, copied there once: the cache of a model spread over GPUs
    keeps each layer on that layer's GPU."""
    copies = {tensor.device: tensor}

    def on(device: torch.device) -> torch.Tensor:
        if device not in copies:
            copies[device] = tensor.to(device)
        return copies[device]

    return on


def on_each_device(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """`tensors` grouped by device, in order (one group unless a model is spread over GPUs)."""
    groups: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.device, []).append(tensor)
    return list(groups.values())
