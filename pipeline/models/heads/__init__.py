"""Head drafts: small modules that read the target's hidden states and borrow its embeddings and
LM head (EAGLE-1/2, EAGLE-3, MSD, ViSpec, Medusa), each loaded from the layout its reference code publishes.

A grid names a head as a pair's draft: `draft: {head: eagle, path: <hub id or folder>}`, which
reads as the draft name `eagle:<path>` (`pipeline.planning.model_ids`). A head is checked
against its target from the two configs alone (hidden size, vocabulary), before any weight is
read, so a grid with a mismatched head is refused before Ray starts.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig

from pipeline.models.base import LVLM
from pipeline.models.head_names import HEAD_KINDS as KIND_NAMES
from pipeline.models.head_names import HeadMismatch, check_head, eagle3_layers, text_config_of
from pipeline.models.heads.draft import HeadDraft, MedusaDraft
from pipeline.models.heads.eagle import EagleHead
from pipeline.models.heads.eagle3 import SPECULATORS_LAYER, Eagle3Head
from pipeline.models.heads.medusa import MedusaHeads
from pipeline.models.heads.msd import MsdHead
from pipeline.models.heads.vispec import VispecHead

# a grid's `head:` -> the module of its layout
HEAD_KINDS = {"eagle": EagleHead, "eagle3": Eagle3Head, "msd": MsdHead, "vispec": VispecHead,
              "medusa": MedusaHeads}
assert tuple(HEAD_KINDS) == KIND_NAMES, "pipeline.models.head_names lists the same kinds, torch-free"
# where each layout keeps its weights, in the order looked for (Medusa's code saves its heads alone)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "medusa_lm_head.safetensors", "medusa_lm_head.pt")
NOT_READ = ("embed_tokens.weight",)  # a copy of the target's, in some checkpoints
# buffers a checkpoint may leave out, keeping their defaults: EAGLE-3's vocabulary maps, when
# the draft vocabulary is the target's (its d2t all zeros)
OPTIONAL = ("d2t", "t2d")


def head_files(path: str) -> Path:
    """The folder holding a head's `config.json` and weights: `path` itself, or the hub's copy."""
    if Path(path).is_dir():
        return Path(path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, allow_patterns=["config.json", *WEIGHT_FILES]))


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(folder / name)
            return torch.load(folder / name, map_location="cpu", weights_only=True)
    raise HeadMismatch(f"head folder {str(folder)!r} has none of {', '.join(WEIGHT_FILES)}")


def load_head(kind: str, path: str, target: LVLM, *,
              dtype: torch.dtype | None = None) -> HeadDraft | MedusaDraft:
    """A `kind` head from `path` (folder or hub id) drafting for `target`, on its device and in its dtype."""
    folder = head_files(path)
    config = json.loads((folder / "config.json").read_text())
    target_config = target.model.config.to_dict()
    check_head(kind, config, target_config, path, target.name)
    weights = {_layout_name(kind, k): v for k, v in read_weights(folder).items() if k not in NOT_READ}
    if kind == "vispec" and "imadpt.q" in weights:  # its query count is in its weights alone
        config = {**config, "num_q": weights["imadpt.q"].shape[0]}
    with torch.device(target.device):  # its rotary tables are made, not read
        module = (MedusaHeads.of_config(config, text_config_of(target_config)) if kind == "medusa"
                  else HEAD_KINDS[kind](LlamaConfig(**text_config_of(config)))).to(dtype or target.dtype)
    expected = set(module.state_dict())
    if missing := sorted(expected - set(weights) - set(OPTIONAL)):
        raise HeadMismatch(f"{kind} head {path!r} lacks {', '.join(missing[:6])}: not the {kind} layout")
    if unexpected := sorted(set(weights) - expected):
        raise HeadMismatch(f"{kind} head {path!r} holds {', '.join(unexpected[:6])}, which the {kind} layout "
                           "does not name")
    try:
        module.load_state_dict(weights, strict=False)
    except RuntimeError as err:  # a weight of another shape: another target's size
        raise HeadMismatch(f"{kind} head {path!r} does not fit target {target.name!r}: "
                           f"{str(err).splitlines()[-1].strip()}") from None
    if kind == "eagle3":
        module.target_layers = eagle3_layers(config, target.model.config.get_text_config().num_hidden_layers)
    return (MedusaDraft if kind == "medusa" else HeadDraft)(module.eval(), target, f"{kind}:{path}", kind)


def _layout_name(kind: str, name: str) -> str:
    """A weight's name as the module holds it: speculators' `layers.0.` is EAGLE-3's `midlayer.`."""
    if kind == "eagle3" and name.startswith(SPECULATORS_LAYER):
        return "midlayer." + name[len(SPECULATORS_LAYER):]
    return name
