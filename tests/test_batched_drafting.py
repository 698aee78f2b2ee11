"""One batch of method rows must give each method the distributions it gets alone (docs/algorithm.md §3)."""
from __future__ import annotations

import torch

from pipeline.decoding.rows import DynamicCacheRows
from pipeline.drafting.methods import method_embeddings
from tests.conftest import solid

PROMPT = "USER: Source: <image> Target: <image> Explain the difference. ASSISTANT:"
IMAGES = [solid((200, 20, 20)), solid((20, 20, 200))]
CAPTIONS = ["a red square", "a blue circle"]


def run_rows(model, methods: str, continuation: list[list[int]]) -> torch.Tensor:
    """Prefill the rows, then feed continuation chunks (cropping one token back between them,
    as after a rejected proposal); returns logits after every chunk: `[chunks, rows, V]`."""
    ids = model.tokenize_prompt(PROMPT)
    rows = DynamicCacheRows(model, [method_embeddings(model, m, ids, IMAGES, CAPTIONS) for m in methods])
    rows.prefill()
    out = []
    for chunk in continuation:
        out.append(rows.feed(chunk)[:, -1])
        rows.settle([len(chunk) - 1] * rows.rows)  # drop the last token again: exercises cache cropping
        rows.feed(chunk[-1:])
        rows.settle([1] * rows.rows)
    return torch.stack(out)


def test_batched_rows_match_each_method_alone(tiny_pair):
    _, draft = tiny_pair
    continuation = [[11, 12], [13], [14, 15, 16]]
    batched = run_rows(draft, "MTCP", continuation)
    for row, method in enumerate("MTCP"):
        alone = run_rows(draft, method, continuation)[:, 0]
        torch.testing.assert_close(batched[:, row], alone, rtol=1e-4, atol=1e-4)


def test_rows_really_have_different_lengths(tiny_pair):
    _, draft = tiny_pair
    ids = draft.tokenize_prompt(PROMPT)
    lengths = [method_embeddings(draft, m, ids, IMAGES, CAPTIONS).shape[0] for m in "MTCP"]
    assert len(set(lengths)) == 4


def test_pooled_features_are_a_2x2_average_of_the_patch_grid(tiny_pair):
    _, draft = tiny_pair
    full = draft.image_features(IMAGES[:1])[0]
    pooled = draft.image_features(IMAGES[:1], pooled=True)[0]
    assert full.shape[0] == 16 and pooled.shape[0] == 4  # 4x4 patches -> 2x2
