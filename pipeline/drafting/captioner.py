"""Captions for drafting method C, computed once per image and cached (docs/algorithm.md §2).

The reference uses Florence-2 `<CAPTION>` with 3 beams; any transformers image-to-text model
(BLIP, Florence-2) can be named instead. `embedded` is the offline captioner of the CPU pair.
"""
from __future__ import annotations

import hashlib
from typing import Protocol

import torch
from PIL import Image

FLORENCE_TASK = "<CAPTION>"


class Captioner(Protocol):
    def caption(self, image: Image.Image) -> str: ...


def image_digest(image: Image.Image) -> str:
    """Content hash of an image, so the same picture is captioned once per process."""
    digest = hashlib.sha1(f"{image.mode}{image.size}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


class CachedCaptioner:
    """Wraps a captioner with a per-image cache (images recur across configurations and turns)."""

    def __init__(self, inner: Captioner) -> None:
        self.inner = inner
        self._cache: dict[str, str] = {}

    def caption(self, image: Image.Image) -> str:
        key = image_digest(image)
        if key not in self._cache:
            self._cache[key] = self.inner.caption(image)
        return self._cache[key]


class HFCaptioner:
    """A transformers image-to-text model (Florence-2 with its `<CAPTION>` task, or BLIP)."""

    def __init__(self, name: str, device: str | torch.device = "cpu", num_beams: int = 3) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(name)
        self.model = AutoModelForImageTextToText.from_pretrained(name).to(device).eval()
        self.prompt = FLORENCE_TASK if "florence" in name.lower() else None
        self.num_beams = num_beams

    @torch.inference_mode()
    def caption(self, image: Image.Image) -> str:
        inputs = self.processor(images=image.convert("RGB"), text=self.prompt, return_tensors="pt")
        inputs = inputs.to(self.model.device)
        out = self.model.generate(**inputs, num_beams=self.num_beams, max_new_tokens=48, do_sample=False)
        return self.processor.batch_decode(out, skip_special_tokens=True)[0].strip()


def load_captioner(name: str, device: str | torch.device = "cpu") -> CachedCaptioner:
    """`embedded` for the offline CPU captioner, else a transformers id or directory."""
    if name == "embedded":
        from pipeline.models.embedded import load_embedded_captioner

        return CachedCaptioner(load_embedded_captioner(device=device))
    return CachedCaptioner(HFCaptioner(name, device=device))
