"""`pld`: transformers' prompt lookup decoding, exactly as `PromptLookupCandidateGenerator.
get_candidates` (transformers/generation/candidate_generator.py, 5.x) picks its candidates.

For n from min(max_matching_ngram_size, len(context) - 1) down to 1 it compares the last n tokens
with every window of size n, the last window (the n-gram itself) included; the first match left to
right whose continuation is non-empty wins, the continuation being
`context[start + n : min(start + n + num_output_tokens, len(context), max_length)]`. So the n-gram
itself never wins (its continuation is empty), an earlier match may overlap it (its continuation
then runs into the n-gram, up to the context's end), and a size with no other match falls back to
n - 1. Here the context is the committed tokens followed by the uncommitted suffix.

Left out, as the decoding loop does each itself: `max_length` (as the end never passes
len(context) < max_length it binds only through the early return at max_length == len + 1, which
is a length budget), the cut at the first EOS, and the logits processors' forbidden tokens (with
none given transformers skips that step too).
"""
from __future__ import annotations

from typing import ClassVar

from pipeline.lookups.ngram_index import FirstNgramLookup


class PromptLookup(FirstNgramLookup):
    """Prompt lookup with the defaults of transformers' constructor (`generate` too defaults the
    n-gram size to 2; it takes the token count from `prompt_lookup_num_tokens`)."""

    kind: ClassVar[str] = "pld"
    PARAMS: ClassVar[dict[str, tuple[int, int]]] = {
        # transformers raises on either <= 0
        "max_matching_ngram_size": (2, 1),
        "num_output_tokens": (10, 1),
    }

    def _bounds(self) -> tuple[int, int, int]:
        return 1, self.params["max_matching_ngram_size"], self.params["num_output_tokens"]
