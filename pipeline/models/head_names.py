"""Which draft names are heads, without torch: what grid checks and planning need to know of a
head before anything loads. A head is named `<kind>:<hub id or folder>` (in a grid file also
`{head: <kind>, path: ...}`), `tiny:<kind>_head` (a tiny head built for a bigram target) or
`embedded:head` (the embedded target's, trained and shipped with the package)."""
from __future__ import annotations

from typing import Any

from pipeline.models.families import TINY_FAMILIES

# `pipeline.models.heads.HEAD_KINDS` holds their modules
HEAD_KINDS = ("eagle", "eagle3", "msd", "vispec", "medusa")
TINY_PREFIX = "tiny:"
# tiny:<name> -> (its kind, the tiny model it reads): every kind for the bigram LLaVA and for
# each chat family made a bigram target (Qwen2.5-VL, Qwen3-VL: M-RoPE; Gemma 3: sliding windows)
TINY_HEADS = {**{f"{kind}_head": (kind, "bigram_target") for kind in HEAD_KINDS},
              **{f"{family}_{kind}_head": (kind, f"{family}_bigram_target")
                 for family in TINY_FAMILIES for kind in HEAD_KINDS}}
EMBEDDED_HEADS = {"embedded:head": ("eagle", "embedded:target")}  # name -> (its kind, the target it reads)
HEAD_METHODS = ("M",)  # a head reads the target's own prompt: it drafts with that prompt alone


def head_kind(name: str) -> str | None:
    """The head kind a draft name names, or None for a model that is not a head."""
    if name.startswith(TINY_PREFIX):
        return TINY_HEADS.get(name[len(TINY_PREFIX):], (None,))[0]
    if name in EMBEDDED_HEADS:
        return EMBEDDED_HEADS[name][0]
    kind, sep, path = name.partition(":")
    return kind if sep and kind in HEAD_KINDS and path else None


def head_path(name: str) -> str:
    """Where a `<kind>:<path>` head's files are (a `tiny:` head is resolved to one first)."""
    return name.partition(":")[2]


class HeadMismatch(ValueError):
    """A head that cannot draft for its target, or whose files are not its kind's layout."""


def text_config_of(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config: a VLM's `text_config`; the speculators format's
    `transformer_layer_config` with the keys beside it; else the whole."""
    nested = ("transformer_layer_config", "speculators_config")
    if nested[0] in config:  # speculators: the layer's config nested, the head's keys beside it
        return {**config[nested[0]], **{k: v for k, v in config.items() if k not in nested}}
    return config.get("text_config") or config


def eagle3_layers(head_config: dict[str, Any], target_layers: int) -> tuple[int, ...]:
    """The target's hidden states an EAGLE-3 head reads: its config's, else EAGLE's default
    (inputs of layers 2, L // 2 and L - 3), which needs a target of six layers or more."""
    named = text_config_of(head_config).get("eagle_aux_hidden_state_layer_ids")
    if named:
        return tuple(named)
    if target_layers < 6:
        raise HeadMismatch(f"EAGLE-3's default layers (2, L // 2, L - 3) need a target of six layers or "
                           f"more, not {target_layers}: name them in eagle_aux_hidden_state_layer_ids")
    return 2, target_layers // 2, target_layers - 3


def check_head(kind: str, head_config: dict[str, Any], target_config: dict[str, Any], head: str,
               target: str) -> None:
    """HeadMismatch naming both when a `kind` head's config cannot draft for the target's: it
    reads the target's states (hidden size); an EAGLE-3 head's own LM head maps into the
    target's vocabulary (EAGLE-1/2's and MSD's borrow the target's, whatever size their config
    copied: original LLaVA's 32000, llava-hf's 32064), and reads layers the target has."""
    if kind not in HEAD_KINDS:
        raise HeadMismatch(f"unknown head kind {kind!r} for {head!r}; choose one of {list(HEAD_KINDS)}")
    mine, theirs = text_config_of(head_config), text_config_of(target_config)
    for key in ("hidden_size", "vocab_size") if kind == "eagle3" else ("hidden_size",):
        if key in mine and mine[key] != theirs.get(key):  # Medusa's config names neither: its weights do
            raise HeadMismatch(f"{kind} head {head!r} has {key} {mine.get(key)} but target {target!r} has "
                               f"{theirs.get(key)}: a head drafts only for the target it was trained on")
    if kind == "eagle3":
        layers = theirs.get("num_hidden_layers", 0)
        wrong = [i for i in eagle3_layers(head_config, layers) if not -layers - 1 <= i <= layers]
        if wrong:
            raise HeadMismatch(f"eagle3 head {head!r} reads layers {wrong} but target {target!r} has "
                               f"{layers} (hidden states 0 to {layers})")
