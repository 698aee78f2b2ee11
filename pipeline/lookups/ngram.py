"""`ngram`: vLLM's n-gram proposer, as `_find_longest_matched_ngram_and_propose_tokens` in
vllm/v1/spec_decode/ngram_proposer.py defines it (its KMP over the reversed context computes this).

The n-gram is the LONGEST suffix of the context, of a size n with prompt_lookup_min <= n <=
prompt_lookup_max, that also occurs at an earlier start (an occurrence ending before the context's
last token; it may overlap the suffix itself). Its EARLIEST occurrence wins, and the proposal is the
up to num_speculative_tokens tokens that followed it, cut at the context's end (so a match near the
end proposes fewer). A context shorter than prompt_lookup_min proposes nothing. Here the context is
the committed tokens followed by the uncommitted suffix (vLLM reads the tokens without the
speculative ones). Left out: vLLM's cut at `max_model_len`, a length budget the decoding loop keeps.

Defaults as vllm/config/speculative.py: with neither bound given both are 5; with one given the
other copies it; prompt_lookup_min > prompt_lookup_max is refused. num_speculative_tokens has no
vLLM default (it is required there): 5 here.
"""
from __future__ import annotations

from typing import ClassVar

from pipeline.lookups.ngram_index import FirstNgramLookup


class NgramLookup(FirstNgramLookup):
    """vLLM's n-gram proposer with vLLM's defaults for the n-gram sizes."""

    kind: ClassVar[str] = "ngram"
    PARAMS: ClassVar[dict[str, tuple[int, int]]] = {
        "prompt_lookup_min": (5, 1),
        "prompt_lookup_max": (5, 1),
        "num_speculative_tokens": (5, 1),
    }

    @classmethod
    def _complete(cls, given: dict[str, int]) -> dict[str, int]:
        """vLLM's rule: a bound given alone sets the other too."""
        if ("prompt_lookup_min" in given) != ("prompt_lookup_max" in given):
            alone = given.get("prompt_lookup_min", given.get("prompt_lookup_max"))
            given = {**given, "prompt_lookup_min": alone, "prompt_lookup_max": alone}
        full = super()._complete(given)
        if full["prompt_lookup_min"] > full["prompt_lookup_max"]:
            raise ValueError(f"ngram lookup: prompt_lookup_min={full['prompt_lookup_min']} must be <= "
                             f"prompt_lookup_max={full['prompt_lookup_max']}")
        return full

    def _bounds(self) -> tuple[int, int, int]:
        p = self.params
        return p["prompt_lookup_min"], p["prompt_lookup_max"], p["num_speculative_tokens"]
