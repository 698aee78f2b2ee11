"""ViSpec's head (KangJialiang/ViSpec `vispec/model/cnets_ours.py`): EAGLE-1/2's head and files
(`pipeline.models.heads.eagle`) with a vision adaptor and an image summary:

- `config.json`: the target's config (flat, its own `architectures` and `model_type`) with one
  layer; `qkv_bias` (Qwen's) gives the layer's q/k/v projections and the adaptor's k/v theirs;
  `bias` (of `fc` and `img_fc`; default: they have one);
- weights: EAGLE's (`fc.*`, `layers.0.*`), and `imadpt.q` `[num_q, heads, head_dim]`,
  `imadpt.{k,v}_proj.weight` (and `.bias`), `imadpt.o_proj.weight`, `img_fc.weight` `[H, 2H]`,
  `img_fc.bias`. `num_q` (2 in the published heads) is not in the config: `imadpt.q` says it.

In a prompt, each image span (its rows' embeddings, the target's projected visual features) is
read by `num_q` learned queries (non-causal attention, the adaptor's `k/v/o` projections); the
first `num_q - 1` adapted vectors are the head's rows at the span's last positions, and the rest of
the span is dropped. The last adapted vector summarises the image: every later token, prompt
text and drafted tokens alike, is fused as `fc([embedding; img_fc([features; summary])])`, the
summary zeros before the first image (`img_fc` starts as `[I | 0]`: plain EAGLE).

Here the dropped rows stay in the head's cache, hidden from every later row, so its rows are the
target's one for one and each keeps its position in the target's sequence; the reference drops
them from its cache. Both rotate prompt rows and tree nodes by their positions in the target's
sequence; the reference's cached continuation counts positions over the shortened sequence, a
to-do in its code, where here every token keeps its own.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig

from pipeline.models.base import ModelInputError
from pipeline.models.heads.eagle import EagleHead
from pipeline.models.heads.prompt import PromptRows

QUERIES = 2  # the published heads' `num_q`, when a config is built without weights


class ImageAdaptor(nn.Module):
    """`num_q` learned queries attending over an image span's embeddings (ViSpec's `ImgAdaptor`)."""

    def __init__(self, config: LlamaConfig, queries: int) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.heads, self.width = heads, hidden // heads
        bias = bool(getattr(config, "qkv_bias", False))
        self.q = nn.Parameter(torch.empty(queries, heads, self.width))
        self.k_proj = nn.Linear(hidden, heads * self.width, bias=bias)
        self.v_proj = nn.Linear(hidden, heads * self.width, bias=bias)
        self.o_proj = nn.Linear(heads * self.width, hidden, bias=False)

    def forward(self, span: torch.Tensor) -> torch.Tensor:
        """`[num_q, H]` adapted vectors of one image span's rows `[n, H]`."""
        split = lambda rows: rows.view(-1, self.heads, self.width).transpose(0, 1)  # [heads, n, width]
        queries = self.q.to(span.dtype).transpose(0, 1)
        attend = nn.functional.scaled_dot_product_attention
        out = attend(queries, split(self.k_proj(span)), split(self.v_proj(span)))  # [heads, num_q, width]
        return self.o_proj(out.transpose(0, 1).reshape(self.q.shape[0], -1))


class VispecHead(EagleHead):
    """EAGLE's head, its image spans adapted and every later token fused with their summary."""

    def __init__(self, config: LlamaConfig) -> None:
        qkv_bias = bool(getattr(config, "qkv_bias", False))
        config.attention_bias = qkv_bias  # the layer's q/k/v biases; its o_proj has none
        super().__init__(config)
        if qkv_bias:
            self.layers[0].self_attn.o_proj.register_parameter("bias", None)
        hidden = config.hidden_size
        self.imadpt = ImageAdaptor(config, getattr(config, "num_q", QUERIES))
        self.img_fc = nn.Linear(2 * hidden, hidden, bias=getattr(config, "bias", True))
        self.post_init()
        with torch.no_grad():  # ViSpec's own start: plain EAGLE, queries at attention's scale
            self.img_fc.weight.zero_()[:, :hidden] = torch.eye(hidden)
            if self.img_fc.bias is not None:
                self.img_fc.bias.zero_()
            nn.init.normal_(self.imadpt.q, std=self.imadpt.width ** -0.5)

    def fuse(self, embeds: torch.Tensor, features: torch.Tensor,
             summary: torch.Tensor | None = None) -> torch.Tensor:
        """`fc([embedding; img_fc([features; summary])])`: `summary` per row `[..., H]` (or one
        fewer dimension, the same for every token of a row; None: no image yet)."""
        features = features.to(embeds.dtype)
        if summary is None:
            summary = torch.zeros_like(features)
        elif summary.dim() < features.dim():
            summary = summary.unsqueeze(-2)
        mixed = self.img_fc(torch.cat([features, summary.to(features.dtype).expand_as(features)], -1))
        return self.fc(torch.cat([embeds, mixed], -1))

    def fuse_prompt(self, embeds: torch.Tensor, features: torch.Tensor,
                    visual: torch.Tensor | None = None) -> PromptRows:
        """The prompt's rows, its image spans replaced by their adapted vectors at the spans'
        last positions (the rest unseen), each text row fused with the summary of the last
        image before it; and the prompt's last summary."""
        summary = embeds.new_zeros(embeds.shape[-1])
        if visual is None or not bool(visual.any()):
            return PromptRows(self.fuse(embeds, features, summary), None, summary)
        visual = visual.to(embeds.device)
        after = torch.cat([visual[1:], visual.new_zeros(1)])
        before = torch.cat([visual.new_zeros(1), visual[:-1]])
        summaries, placed = embeds.new_zeros(embeds.shape), []
        starts, ends = (visual & ~before).nonzero()[:, 0].tolist(), (visual & ~after).nonzero()[:, 0].tolist()
        for start, end in zip(starts, ends):
            adapted = self.imadpt(embeds[start : end + 1])
            kept = adapted.shape[0] - 1
            if end + 1 - start < kept:
                raise ModelInputError(f"an image of {end + 1 - start} rows is shorter than this ViSpec "
                                      f"head's {kept} adapted rows")
            summary = adapted[-1]
            summaries[end + 1 :] = summary
            placed.append((end + 1 - kept, end + 1, adapted[:-1]))
        rows, unseen = self.fuse(embeds, features, summaries), visual.clone()
        for first, last, vectors in placed:
            rows[first:last], unseen[first:last] = vectors, False
        return PromptRows(rows, unseen, summary)
