"""The transformers captioner path (BLIP / Florence-2 style) on a tiny BLIP built locally."""
from __future__ import annotations

import pytest
from transformers import (
    BertTokenizerFast,
    BlipConfig,
    BlipForConditionalGeneration,
    BlipImageProcessor,
    BlipProcessor,
)

from pipeline.drafting.captioner import CachedCaptioner, load_captioner
from tests.conftest import solid

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "blue", "square", "circle", "image", "of"]


@pytest.fixture(scope="module")
def tiny_blip_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("blip")
    (out / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(out / "vocab.txt"))
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tokenizer)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = BlipConfig(
        text_config=dict(vocab_size=len(WORDS), pad_token_id=0, bos_token_id=2, sep_token_id=3, eos_token_id=3, **small),
        vision_config=dict(image_size=32, patch_size=8, **small),
        projection_dim=32,
    )
    BlipForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)
    return str(out)


def test_hf_captioner_writes_a_caption_once_per_image(tiny_blip_dir):
    captioner = load_captioner(tiny_blip_dir)
    assert isinstance(captioner, CachedCaptioner)
    calls = []
    model_caption = captioner.inner.caption
    captioner.inner.caption = lambda image: calls.append(image) or model_caption(image)
    first = captioner.caption(solid((200, 20, 20)))
    assert isinstance(first, str) and first == captioner.caption(solid((200, 20, 20)))
    captioner.caption(solid((20, 20, 200)))
    assert len(calls) == 2  # the repeated image was not captioned again
