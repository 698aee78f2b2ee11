"""The embedded CPU pair: real pretrained parts, the LVLM contract, and what training achieved."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.decoding.rows import DynamicCacheRows
from pipeline.drafting.methods import method_embeddings
from pipeline.models.base import ModelInputError
from pipeline.models.chat_formats import to_chatml
from pipeline.models.embedded_parts.easyvqa import COLORS, SHAPES, load_split
from pipeline.models.embedded_parts.quant import BITS, GROUP, fake_quantize
from pipeline.models.loading import load_target_and_drafts

DESCRIBE = "USER: <image>\nDescribe the image in detail. ASSISTANT:"
SHORT = "USER: <image>\nWhat is in the image? Answer briefly. ASSISTANT:"
TWO_IMAGES = "USER: Source: <image> Target: <image> Explain the difference. ASSISTANT:"


@pytest.fixture(scope="module")
def models():
    """The target and both drafts, loaded through the pipeline's own entry point (which also
    checks that the tokenizers match)."""
    names = ("embedded:draft", "embedded:small_draft")
    target, drafts = load_target_and_drafts("embedded:target", {name: name for name in names})
    return target, drafts["embedded:draft"], drafts["embedded:small_draft"]


@pytest.fixture(scope="module")
def pair(models):
    return models[:2]


@pytest.fixture(scope="module")
def test_images():
    """The first easy-vqa test images (never seen by the projector or captioner in training)."""
    return load_split("test")[:6]


def image_of(item) -> Image.Image:
    return Image.open(item.path).convert("RGB")


def names(text: str, item) -> bool:
    words = set(text.lower().replace(".", " ").replace(",", " ").split())
    return {c for c in COLORS if c in words} == {item.color} and {s for s in SHAPES if s in words} == {item.shape}


def test_llava_prompts_become_chatml():
    assert to_chatml(DESCRIBE) == (
        "<|im_start|>user\n<image>\nDescribe the image in detail.<|im_end|>\n<|im_start|>assistant\n"
    )
    second = to_chatml("USER: <image>\nWhat is it? ASSISTANT: A circle. USER: Why? ASSISTANT:")
    assert second.endswith(
        "<|im_start|>assistant\nA circle.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError, match="ASSISTANT:"):
        to_chatml("USER: hello ASSISTANT: an answer")


def test_easy_vqa_labels_come_from_the_questions():
    train = {item.image_id: item for item in load_split("train")}
    assert (train[0].color, train[0].shape) == ("blue", "rectangle")  # "what is the blue shape?" -> rectangle
    assert (train[3].color, train[3].shape) == ("brown", "rectangle")
    assert 49 not in train  # its questions rule out 3 colours and leave 5 open
    with pytest.raises(ValueError, match="unknown easy-vqa split"):
        load_split("validation")


def test_one_placeholder_id_per_image(pair):
    target, draft = pair
    for prompt, n in ((DESCRIBE, 1), (TWO_IMAGES, 2)):
        ids = target.tokenize_prompt(prompt)
        assert ids.count(target.image_token_id) == n
        assert ids == draft.tokenize_prompt(prompt)
    assert target.image_token_id >= target.vocab_size  # input-only: the LM never predicts it


def test_image_features_full_and_pooled(pair, test_images):
    target, _ = pair
    images = [image_of(item) for item in test_images[:2]]
    full, pooled = target.image_features(images), target.image_features(images, pooled=True)
    assert [f.shape for f in full] == [torch.Size([49, 576])] * 2
    assert [f.shape for f in pooled] == [torch.Size([16, 576])] * 2
    assert full[0].dtype == target.dtype and full[0].device == target.device
    assert not torch.allclose(full[0], full[1])  # different pictures, different tokens


def test_placeholder_embeds_as_zeros_and_is_refused_as_input(pair):
    target, _ = pair
    ids = torch.tensor([[1, target.image_token_id, 2]])
    embeds = target.embed_tokens(ids)
    assert embeds.shape == (1, 3, 576) and embeds[0, 1].abs().sum() == 0 and embeds[0, 0].abs().sum() > 0
    with pytest.raises(ModelInputError, match="placeholder"):
        target.logits(cache=target.new_cache(), attention_mask=torch.ones(1, 3, dtype=torch.long),
                      position_ids=torch.arange(3)[None], input_ids=ids)


def rows_logits(model, methods: str, images, captions) -> torch.Tensor:
    """Logits after prefill + 3 shared tokens for each method row: `[rows, V]`."""
    ids = model.tokenize_prompt(TWO_IMAGES)
    rows = DynamicCacheRows(model, [method_embeddings(model, m, ids, images, captions)[:-1] for m in methods])
    rows.prefill()
    rows.feed([ids[-1], 504, 3158])
    return rows.feed([30])[:, -1]


@pytest.mark.parametrize("variant", [0, 1, 2], ids=["target", "draft", "small_draft"])
def test_left_padded_batch_rows_equal_single_rows(models, test_images, variant):
    model = models[variant]
    images = [image_of(item) for item in test_images[:2]]
    captions = ["a red triangle", "a blue circle"]
    batched = rows_logits(model, "MTCP", images, captions)
    for row, method in enumerate("MTCP"):
        alone = rows_logits(model, method, images, captions)[0]
        torch.testing.assert_close(batched[row], alone, rtol=1e-4, atol=1e-4)


def test_draft_is_a_4bit_weight_copy_of_the_target(pair):
    target, draft = pair
    t_layer, d_layer = target.model.model.layers[0], draft.model.model.layers[0]
    groups = d_layer.self_attn.q_proj.weight.reshape(-1, GROUP)
    assert max(len(g.unique()) for g in groups[:64]) <= 2**BITS - 1  # symmetric: -7..7 times a scale
    assert not torch.equal(t_layer.self_attn.q_proj.weight, d_layer.self_attn.q_proj.weight)
    assert torch.equal(t_layer.mlp.down_proj.weight, d_layer.mlp.down_proj.weight)  # kept
    assert torch.equal(target.model.lm_head.weight, draft.model.lm_head.weight)
    ids = torch.tensor([target.tokenize_prompt("USER: Name three colours. ASSISTANT:")])
    logits = [m.logits(cache=m.new_cache(), attention_mask=torch.ones_like(ids),
                       position_ids=torch.arange(ids.shape[1])[None], input_ids=ids, keep=ids.shape[1])[0]
              for m in (target, draft)]
    agree = (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean()
    assert 0.5 < agree < 1.0  # a different model that mostly predicts what the target does


def test_small_draft_is_small_shipped_and_reads_images_its_own_way(models, test_images):
    from pipeline.models.embedded import SMALL_DRAFT_DIR

    target, _, small = models
    assert sum(p.numel() for p in small.model.parameters()) < 0.1 * sum(p.numel() for p in target.model.parameters())
    shipped = sum(f.stat().st_size for f in SMALL_DRAFT_DIR.iterdir()) / 2**20
    assert shipped < 20, f"{shipped:.1f} MB of package data"
    assert small.vocab_size == target.vocab_size and small.image_token_id == target.image_token_id
    features = small.image_features([image_of(test_images[0])], pooled=True)[0]
    assert features.shape == (16, small.model.config.hidden_size)  # its own projector, same vision encoder


def test_small_draft_proposes_from_its_output_vocabulary_with_the_full_heads_logits(models):
    from pipeline.models.embedded_parts.small_draft import COMMON_TOKENS

    _, _, small = models
    head = small.model.lm_head
    kept = head.token_ids
    assert kept[:COMMON_TOKENS].tolist() == list(range(COMMON_TOKENS)) and len(kept) < small.vocab_size / 4
    ids = torch.tensor([small.tokenize_prompt("USER: Describe a red circle. ASSISTANT:")])
    logits = small.logits(cache=small.new_cache(), attention_mask=torch.ones_like(ids),
                          position_ids=torch.arange(ids.shape[1])[None], input_ids=ids, keep=2)[0]
    assert logits.shape == (2, small.vocab_size)
    outside = torch.ones(small.vocab_size, dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(logits[:, outside]).all()
    hidden = small.model.model(input_ids=ids).last_hidden_state[0, -2:]
    full_head = hidden @ small.model.get_input_embeddings().weight.T  # the tied head it was trained with
    torch.testing.assert_close(logits[:, kept], full_head[:, kept])


def test_fake_quantize_rounds_each_group_to_a_symmetric_integer_grid():
    torch.manual_seed(0)
    weight = torch.randn(8, 2 * GROUP)
    rounded = fake_quantize(weight)
    for group, original in zip(rounded.reshape(-1, GROUP), weight.reshape(-1, GROUP)):
        scale = original.abs().max() / (2 ** (BITS - 1) - 1)
        torch.testing.assert_close(group / scale, torch.round(group / scale))
        assert (group - original).abs().max() <= scale / 2 + 1e-6
    with pytest.raises(ValueError, match="groups of"):
        fake_quantize(torch.randn(4, GROUP + 1))


def test_captioner_names_colour_and_shape(test_images):
    from pipeline.models.embedded import load_embedded_captioner

    captioner = load_embedded_captioner()
    for item in test_images:
        assert captioner.caption(image_of(item)) == item.caption


def test_target_answers_name_colour_and_shape(pair, test_images):
    target, _ = pair
    for i, item in enumerate(test_images[:3]):
        sample = Sample("easy-vqa", "test", item.image_id, "first", SHORT, (image_of(item),))
        record = autoregressive_decode(target, [sample], max_new_tokens=10)[0]
        assert names(record.output_text, item), (item.caption, record.output_text)


@pytest.mark.slow
def test_speculative_decoding_is_lossless_and_accepts_proposals(pair, test_images):
    target, draft = pair
    item = test_images[0]
    sample = Sample("easy-vqa", "test", item.image_id, "first", DESCRIBE, (image_of(item),))
    reference = autoregressive_decode(target, [sample], max_new_tokens=48)[0]
    assert len(reference.output_ids) >= 40  # a long, image-grounded answer
    assert item.color in reference.output_text.lower()
    for methods in ("M", "MT"):
        record = speculative_decode(target, draft, [sample], DecodeConfig(methods=methods, max_new_tokens=48))[0]
        assert record.output_ids == reference.output_ids
        assert record.tau > 1.5, (methods, record.accepted_per_block)


@pytest.mark.slow
def test_small_draft_is_lossless_with_every_method(models, test_images):
    """The distilled draft serves M, T, C and P (and their ensemble) on a held-out test image."""
    target, _, small = models
    item = test_images[1]
    sample = Sample("easy-vqa", "test", item.image_id, "first", DESCRIBE, (image_of(item),))
    reference = autoregressive_decode(target, [sample], max_new_tokens=32)[0]

    class Captions:
        def caption(self, image):
            return item.caption

    for methods in ("M", "T", "C", "P", "MTCP"):
        record = speculative_decode(target, small, [sample], DecodeConfig(methods=methods, max_new_tokens=32), Captions())[0]
        assert record.output_ids == reference.output_ids, methods
        assert record.tau > 1.5, (methods, record.accepted_per_block)


@pytest.mark.slow
def test_cached_language_model_equals_the_gguf(pair):
    from transformers import AutoModelForCausalLM

    from pipeline.models.embedded_parts.language import GGUF_FILE, gguf_dir

    target, _ = pair
    reference = AutoModelForCausalLM.from_pretrained(gguf_dir(), gguf_file=GGUF_FILE, dtype=torch.float32)
    cached = target.model.state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(cached[name], tensor), name
