"""The draft's weights: the target's, rounded to 4-bit integers in groups of 64 (weight-only).

Why weight-only: activation quantization (torch.ao `quantize_dynamic`, or any int8 activation
path) rounds values that were computed in floating point. A row's values differ in their last
bits with the batch's shape (GEMM blocking, padding), and rounding turns those into different
tokens, so a drafting method's distributions would depend on the other rows of its batch,
while batched drafting requires each row to equal that method run alone (measured: per-token
int8 activations moved draft logits by up to 1.7 between batched and single rows). Weights
rounded once at load time keep the draft deterministic and batch-independent, on any device
and dtype; the price is that the draft is not faster than the target.
"""
from __future__ import annotations

import torch

BITS = 4
GROUP = 64


def fake_quantize(weight: torch.Tensor, bits: int = BITS, group: int = GROUP) -> torch.Tensor:
    """Symmetric absmax rounding to `bits`-bit integers per group of `group` consecutive
    inputs (per output row), returned dequantized in the weight's dtype."""
    if weight.shape[-1] % group:
        raise ValueError(f"weight with {weight.shape[-1]} inputs does not split into groups of {group}")
    qmax = 2 ** (bits - 1) - 1
    groups = weight.float().reshape(-1, group)
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / qmax
    rounded = torch.round(groups / scale).clamp(-qmax, qmax) * scale
    return rounded.reshape(weight.shape).to(weight.dtype)


@torch.no_grad()
def quantize_weights(model: torch.nn.Module, skip: tuple[str, ...], bits: int = BITS,
                     group: int = GROUP) -> int:
    """Round the weights of every nn.Linear whose name does not end with one of `skip`, in
    place; returns how many layers were rounded."""
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith(skip):
            module.weight.copy_(fake_quantize(module.weight, bits, group))
            count += 1
    return count
