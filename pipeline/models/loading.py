"""Load a target or draft by hub id or local directory, with the model class its config names.

The reference code mapped every llava-hf id to the LLaVA-1.5 class, which breaks LLaVA-NeXT;
here the config's `model_type` picks the family (`pipeline.models.families`), and a
multimodal type outside them is refused rather than driven as text.
"""
from __future__ import annotations

import torch
import transformers
from transformers import AutoConfig, AutoImageProcessor, AutoModelForCausalLM, AutoProcessor, AutoTokenizer

from pipeline.models.base import LVLM
from pipeline.models.dtypes import resolve_dtype
from pipeline.models.families import (
    FAMILIES, RECURRENT_TYPES, UnsupportedFamily, check_family, drafts_only, is_recurrent_config,
)
from pipeline.models.gemma3 import HFGemma3, HFGemma3Text
from pipeline.models.head_names import EMBEDDED_HEADS, head_kind, head_path
from pipeline.models.lookup_names import lookup_spec, mixed_parts, model_of, reads_target
from pipeline.models.hf import HFLlava, HFModel
from pipeline.models.internvl import HFInternVL
from pipeline.models.qwen_vl import HFQwen3VL, HFQwenVL
from pipeline.models.recurrent import RecurrentLlava, RecurrentLM, is_hybrid, is_recurrent, layer_kinds
from pipeline.models.sharding import DoesNotFit, check_fits_one_gpu, empty_model, gpu_budgets, plan_device_map

EMBEDDED_PREFIX = "embedded:"
# families driven by another adapter than `HFLlava`
FAMILY_ADAPTERS = {"qwen2_5_vl": HFQwenVL, "qwen3_vl": HFQwen3VL, "internvl": HFInternVL, "gemma3": HFGemma3}
TEXT_ADAPTERS = {"gemma3_text": HFGemma3Text}  # text-only drafts in their family's prompt format


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded here (missing, unknown type, does not fit the device)."""


def default_device() -> torch.device:
    """`cuda` when this process was given a GPU (e.g. by Ray), else `cpu`."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(
    name_or_dir: str, *, dtype: str = "fp32", device: str | torch.device = "cpu", allow_text: bool = False,
    gpus: int = 1,
) -> LVLM:
    """A model ready for the engine, on `device`, in `dtype` (fp32 / fp16 / bf16); a plain
    causal LM only with `allow_text`. `gpus` > 1: spread over that many GPUs, the first of them
    its home (`pipeline.models.sharding`)."""
    torch_dtype = resolve_dtype(dtype)
    device = torch.device(device)
    if name_or_dir.startswith(EMBEDDED_PREFIX):
        from pipeline.models.embedded import load_embedded

        return load_embedded(name_or_dir[len(EMBEDDED_PREFIX):], dtype=dtype, device=device)
    try:
        config = AutoConfig.from_pretrained(name_or_dir)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load model {name_or_dir!r}: {err}") from err
    try:
        family = check_family(config.to_dict(), name_or_dir, allow_text=allow_text)
    except UnsupportedFamily as err:
        raise ModelLoadError(str(err)) from None
    if is_hybrid(config) or (is_recurrent(config) and not is_recurrent_config(config.to_dict())):
        raise ModelLoadError(f"cannot drive {name_or_dir!r}: its language model's layers "
                             f"{sorted(layer_kinds(config))} are not one this engine rolls back "
                             f"(attention, or pure {'/'.join(RECURRENT_TYPES.values())})")
    recurrent = is_recurrent(config)
    text = family not in FAMILIES
    model_class = AutoModelForCausalLM if text else getattr(transformers, FAMILIES[family].model_class)
    try:
        if gpus > 1:
            placement = plan_device_map(empty_model(model_class, config, torch_dtype), gpu_budgets(gpus),
                                        name_or_dir)
            model = model_class.from_pretrained(name_or_dir, dtype=torch_dtype, device_map=placement)
        else:
            if device.type == "cuda":
                check_fits_one_gpu(empty_model(model_class, config, torch_dtype),
                                   torch.cuda.mem_get_info(device)[0], name_or_dir)
            model = model_class.from_pretrained(name_or_dir, dtype=torch_dtype).to(device)
        if text:
            adapter_class = RecurrentLM if recurrent else TEXT_ADAPTERS.get(config.model_type, HFModel)
            adapter: LVLM = adapter_class(model, AutoTokenizer.from_pretrained(name_or_dir), name_or_dir)
        else:
            adapter_class = RecurrentLlava if recurrent else FAMILY_ADAPTERS.get(family, HFLlava)
            adapter = adapter_class(model, _processor(name_or_dir), name_or_dir)
    except DoesNotFit as err:
        raise ModelLoadError(str(err)) from None
    except torch.OutOfMemoryError as err:
        where = f"{gpus} GPUs" if gpus > 1 else device
        raise ModelLoadError(f"model {name_or_dir!r} does not fit on {where} in {dtype}: {err}") from err
    return adapter


class ImageTextProcessor:
    """The two parts of a processor the adapter uses, for checkpoints whose full processor
    cannot be built here (LLaVA-OneVision's also wants a video processor, which needs torchvision)."""

    def __init__(self, name_or_dir: str) -> None:
        self.image_processor = AutoImageProcessor.from_pretrained(name_or_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(name_or_dir)


def _processor(name_or_dir: str):
    try:
        return AutoProcessor.from_pretrained(name_or_dir)
    # a missing optional backend, or no processor config
    except (ImportError, AttributeError, ValueError, TypeError):
        return ImageTextProcessor(name_or_dir)


def check_same_tokenizer(target: LVLM, draft: LVLM) -> None:
    """SD compares token ids, so the draft must speak the target's vocabulary exactly."""
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ValueError(
            f"draft {draft.name!r} uses a different tokenizer from target {target.name!r} "
            f"({len(draft.tokenizer)} vs {len(target.tokenizer)} tokens): "
            "speculative decoding needs the same vocabulary"
        )


def load_pair(
    target: str, draft: str, *, dtype: str = "fp32", device: str | torch.device = "cpu",
    allow_text: bool = False,
) -> tuple[LVLM, LVLM]:
    """Target and draft on one device, checked to share a tokenizer."""
    loaded, drafts = load_target_and_drafts(target, {draft: draft}, dtype=dtype, device=device,
                                            allow_text=allow_text)
    return loaded, drafts[draft]


def load_target_and_drafts(
    target: str, drafts: dict[str, str], *, dtype: str = "fp32", device: str | torch.device = "cpu",
    allow_text: bool = False, gpus: int = 1,
) -> tuple[LVLM, dict[str, LVLM]]:
    """A target and several drafts (name -> what to load) on one device, the target once,
    each draft checked to share its tokenizer. `gpus` > 1: the drafts load on the first GPU
    and the target is spread over the first `gpus` (`pipeline.models.sharding`)."""
    device = torch.device(device)
    if gpus > 1 and (device.type != "cuda" or torch.cuda.device_count() < gpus):
        raise ModelLoadError(f"cannot spread {target!r} over {gpus} GPUs: this process sees "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    home = torch.device("cuda", 0) if gpus > 1 else device

    def load(name: str, spread: int = 1) -> LVLM:
        return load_model(name, dtype=dtype, device=home, allow_text=allow_text, gpus=spread)

    # spread: the drafts first, so the target's plan sees what they leave free on the first GPU; a
    # draft model beside a lookup loads once, as itself
    own = {model_of(path) for path in drafts.values() if not reads_target(path)}
    early = {path: load(path) for path in own} if gpus > 1 else {}
    loaded = load(target, gpus)
    try:
        drafts_only(target, "target", recurrent=loaded.recurrent)
    except UnsupportedFamily as err:
        raise ModelLoadError(str(err)) from None
    by_path = early or {path: load(path) for path in own}
    for model in by_path.values():
        check_same_tokenizer(loaded, model)
    models = {}
    for name, path in drafts.items():  # a head or lookup reads the target: after it, with its tokenizer
        if lookup_spec(path) is not None or mixed_parts(path) is not None:
            from pipeline.models.lookup_draft import LookupDraft
            from pipeline.models.mixed_draft import MixedDraft

            lookup = path if lookup_spec(path) is not None else mixed_parts(path)[1]
            models[name] = LookupDraft(loaded, lookup, *lookup_spec(lookup))
            if lookup != path:
                model = model_of(path)  # a head beside a lookup reads the target, as alone
                own_model = load_head_of(model, loaded) if head_kind(model) else by_path[model]
                models[name] = MixedDraft(own_model, models[name], path)
        elif head_kind(path) is not None:
            models[name] = load_head_of(path, loaded)
        else:
            models[name] = by_path[path]
    return loaded, models


def load_head_of(name: str, target: LVLM) -> LVLM:
    """The head `name` (`<kind>:<path>`, `pipeline.models.head_names`) drafting for `target`."""
    from pipeline.models.heads import HeadMismatch, load_head

    path = head_path(name)
    if name in EMBEDDED_HEADS:  # shipped with the package
        from pipeline.models.embedded import HEAD_DIR

        path = str(HEAD_DIR)
    try:
        return load_head(head_kind(name), path, target)
    except (HeadMismatch, OSError) as err:
        raise ModelLoadError(f"cannot load head {name!r} for {target.name!r}: {err}") from None
