"""Draft-free lookups (`pipeline.lookups`) against their reference semantics: `pld` against
transformers' own PromptLookupCandidateGenerator, `ngram` and `sam` against brute-force
transcriptions of their definitions, each also over a suffix of uncommitted tokens."""
from __future__ import annotations

import copy
import random

import pytest

from pipeline.lookups import LOOKUP_KINDS, lookup_defaults, new_lookup


def split_propose(kind: str, params: dict, seq: list[int], rng: random.Random) -> list[int]:
    """The proposal after `seq`, its head committed in random chunks and its tail as the suffix."""
    lookup, cut, at = new_lookup(kind, params), rng.randint(0, len(seq)), 0
    while at < cut:
        step = rng.randint(1, 7)
        lookup.extend(seq[at:min(at + step, cut)])
        at += step
    return lookup.propose(seq[cut:])


def test_pld_proposes_transformers_candidates():
    torch = pytest.importorskip("torch")
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng, found = random.Random(0), 0
    for _ in range(100):
        vocab, size = rng.randint(8, 20), rng.randint(5, 60)
        ids = [rng.randrange(vocab) for _ in range(size)]
        params = {"max_matching_ngram_size": rng.randint(1, 4), "num_output_tokens": rng.randint(1, 12)}
        generator = PromptLookupCandidateGenerator(eos_token_id=None, max_length=10**6, **params)
        candidates, _ = generator.get_candidates(torch.tensor([ids]))
        expected = candidates[0, size:].tolist()
        whole = new_lookup("pld", params)
        whole.extend(ids)
        assert whole.propose() == expected, (ids, params)
        assert split_propose("pld", params, ids, rng) == expected, (ids, params)
        found += bool(expected)
    assert found >= 50  # the small vocabulary makes matches common: the comparison is not all []


def ngram_reference(seq: list[int], low: int, high: int, k: int) -> list[int]:
    """vLLM's definition: the longest suffix n-gram (low <= n <= high) with an occurrence ending
    before the last token, its earliest such occurrence, then up to k tokens (to the end)."""
    total = len(seq)
    for n in range(min(high, total - 1), low - 1, -1):
        for start in range(total - n):
            if seq[start:start + n] == seq[total - n:]:
                return seq[start + n:start + n + k]
    return []


def test_ngram_follows_its_definition():
    rng, found = random.Random(1), 0
    for _ in range(400):
        seq = [rng.randrange(rng.randint(2, 8)) for _ in range(rng.randint(0, 50))]
        low = rng.randint(1, 4)
        high, k = rng.randint(low, 6), rng.randint(1, 8)
        params = {"prompt_lookup_min": low, "prompt_lookup_max": high, "num_speculative_tokens": k}
        expected = ngram_reference(seq, low, high, k)
        assert split_propose("ngram", params, seq, rng) == expected, (seq, params)
        found += bool(expected)
    assert found >= 100


@pytest.mark.parametrize("seq, params, expected", [
    # vLLM's docstring example: [4, 2, 3] has no earlier match; [2, 3] has, 3 tokens to the end
    ([1, 2, 3, 4, 2, 3], {"prompt_lookup_min": 2, "prompt_lookup_max": 3, "num_speculative_tokens": 4},
     [4, 2, 3]),
    # the earliest occurrence of [1, 2], not the latest
    ([1, 2, 9, 1, 2, 8, 1, 2], {"prompt_lookup_min": 2, "prompt_lookup_max": 2, "num_speculative_tokens": 3},
     [9, 1, 2]),
    # the longest n-gram wins over an earlier shorter one ...
    ([2, 3, 8, 1, 2, 3, 9, 1, 2, 3], {"prompt_lookup_min": 1, "prompt_lookup_max": 3,
                                      "num_speculative_tokens": 3}, [9, 1, 2]),
    # ... unless prompt_lookup_max caps it
    ([2, 3, 8, 1, 2, 3, 9, 1, 2, 3], {"prompt_lookup_min": 1, "prompt_lookup_max": 2,
                                      "num_speculative_tokens": 3}, [8, 1, 2]),
    # prompt_lookup_min: [7, 1, 2] occurs only as the suffix, a 2-gram is too short
    ([5, 1, 2, 7, 1, 2], {"prompt_lookup_min": 3, "prompt_lookup_max": 3}, []),
    ([5, 1, 2, 7, 1, 2], {"prompt_lookup_min": 2, "prompt_lookup_max": 3}, [7, 1, 2]),
    # an occurrence overlapping the suffix proposes up to the end
    ([4, 4, 4, 4], {"prompt_lookup_min": 2, "prompt_lookup_max": 3}, [4]),
])
def test_ngram_examples(seq, params, expected):
    rng = random.Random(len(seq))
    for _ in range(5):
        assert split_propose("ngram", params, seq, rng) == expected


def test_ngram_defaults_are_vllms():
    check = LOOKUP_KINDS["ngram"].check_params
    assert check({}) == {"prompt_lookup_min": 5, "prompt_lookup_max": 5, "num_speculative_tokens": 5}
    assert check({"prompt_lookup_max": 3})["prompt_lookup_min"] == 3  # one bound alone sets both
    assert check({"prompt_lookup_min": 7})["prompt_lookup_max"] == 7
    with pytest.raises(ValueError, match="prompt_lookup_min=4 must be <= prompt_lookup_max=2"):
        check({"prompt_lookup_min": 4, "prompt_lookup_max": 2})


def sam_match_length(seq: list[int]) -> int:
    """The longest suffix with an occurrence ending before the last token."""
    total, best = len(seq), 0
    for n in range(1, total):
        if not any(seq[end - n + 1:end + 1] == seq[total - n:] for end in range(n - 1, total - 1)):
            break
        best = n
    return best


def sam_reference(seq: list[int], n_predicts: int, len_threshold: int) -> list[int]:
    """The documented rule: below the threshold nothing; else, from the match down, the first
    suffix length whose first end leaves >= n_predicts tokens before the last one (else length 1),
    and the up to n_predicts - 1 tokens after that end, before the last token."""
    total, length = len(seq), sam_match_length(seq)
    if length < len_threshold:
        return []
    ends = [next(end for end in range(n - 1, total - 1) if seq[end - n + 1:end + 1] == seq[total - n:])
            for n in range(length, 0, -1)]
    end = next((end for end in ends if total - 2 - end >= n_predicts), ends[-1])
    return seq[end + 1:min(end + n_predicts, total - 1)]


def test_sam_matches_and_proposes_by_its_rule():
    rng, found = random.Random(2), 0
    for _ in range(150):
        params = {"n_predicts": rng.randint(2, 12), "len_threshold": rng.randint(1, 4)}
        lookup, seq = new_lookup("sam", params), []
        for _ in range(rng.randint(1, 12)):
            chunk = [rng.randrange(rng.choice((2, 3, 5))) for _ in range(rng.randint(1, 6))]
            lookup.extend(chunk)
            seq += chunk
            assert lookup.match_length == sam_match_length(seq), seq
            expected = sam_reference(seq, **params)
            assert lookup.propose() == expected, (seq, params)
            assert len(expected) <= lookup.max_tokens
            found += bool(expected)
    assert found >= 300


def test_sam_suffix_is_an_uncommitted_extension():
    rng = random.Random(3)
    for _ in range(150):
        params = {"n_predicts": rng.randint(2, 12), "len_threshold": rng.randint(1, 4)}
        lookup = new_lookup("sam", params)
        lookup.extend([rng.randrange(3) for _ in range(rng.randint(0, 40))])
        suffix = [rng.randrange(3) for _ in range(rng.randint(1, 8))]
        before = copy.deepcopy(vars(lookup))
        extended = copy.deepcopy(lookup)
        extended.extend(suffix)
        assert lookup.propose(suffix) == extended.propose()
        assert vars(lookup) == before  # the index is as it was


@pytest.mark.parametrize("seq, params, expected", [
    # the match [1, 2, 3] is below the threshold 4: nothing
    ([1, 2, 3, 4, 1, 2, 3], {"len_threshold": 4}, []),
    # at the threshold: what followed its first end, before the last token (DynSAM's root)
    ([1, 2, 3, 4, 1, 2, 3], {"len_threshold": 3}, [4, 1, 2]),
    # 2 tokens follow [1, 2]'s first end, enough for n_predicts 2 (one token) ...
    ([2, 5, 6, 7, 1, 2, 9, 1, 2], {"n_predicts": 2, "len_threshold": 2}, [9]),
    # ... not for n_predicts 3: the shorter [2], whose link is the root, first ends earlier
    ([2, 5, 6, 7, 1, 2, 9, 1, 2], {"n_predicts": 3, "len_threshold": 2}, [5, 6]),
])
def test_sam_examples(seq, params, expected):
    lookup = new_lookup("sam", params)
    lookup.extend(seq)
    assert lookup.propose() == expected


@pytest.mark.parametrize("kind", sorted(LOOKUP_KINDS))
def test_no_match_proposes_nothing(kind):
    lookup = new_lookup(kind, {})
    assert lookup.propose() == [] and lookup.propose([3, 4]) == []
    lookup.extend(range(50))
    assert lookup.propose() == [] and lookup.propose([50, 51]) == []


def test_defaults_and_sizes():
    assert lookup_defaults("pld") == {"max_matching_ngram_size": 2, "num_output_tokens": 10}
    assert lookup_defaults("ngram") == {"prompt_lookup_min": 5, "prompt_lookup_max": 5,
                                        "num_speculative_tokens": 5}
    assert lookup_defaults("sam") == {"n_predicts": 40, "len_threshold": 5}
    assert [new_lookup(kind, {}).max_tokens for kind in ("pld", "ngram", "sam")] == [10, 5, 39]
    assert new_lookup("pld", {"num_output_tokens": 3}).params["max_matching_ngram_size"] == 2


@pytest.mark.parametrize("kind", sorted(LOOKUP_KINDS))
def test_bad_hyperparameters_are_named(kind):
    name = next(iter(lookup_defaults(kind)))
    with pytest.raises(ValueError, match="unknown hyperparameter 'window'"):
        new_lookup(kind, {"window": 3})
    for bad in (0, -2, "3", 2.5, True, None):
        with pytest.raises(ValueError, match=name):
            LOOKUP_KINDS[kind].check_params({name: bad})
        with pytest.raises(ValueError, match=name):
            new_lookup(kind, {name: bad})


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown lookup kind 'pdl' \(did you mean 'pld'\?\); "
                                         r"known: pld, ngram, sam"):
        new_lookup("pdl", {})
    with pytest.raises(ValueError, match="unknown lookup kind 'suffix'"):
        lookup_defaults("suffix")


def brute_force_followers(seq: list[int], branch_length: int, window: int) -> dict[int, int]:
    """The branch trie's definition, read off the sequence: how often each token followed the
    longest suffix (at most `window` tokens, and no deeper than a branch) that was followed before."""
    for width in range(min(window, branch_length, len(seq)), 0, -1):
        path, found = seq[-width:], {}
        for i in range(len(seq) - width):
            if seq[i : i + width] == path:
                found[seq[i + width]] = found.get(seq[i + width], 0) + 1
        if found:
            return found
    return {}


def test_lookahead_ranks_what_followed_the_longest_suffix():
    rng = random.Random(3)
    for _ in range(300):
        params = {"branch_length": rng.randint(1, 6), "match_window": rng.randint(1, 5)}
        lookup = new_lookup("lookahead", params)
        context = [rng.randint(0, 4) for _ in range(rng.randint(0, 40))]
        suffix = [rng.randint(0, 4) for _ in range(rng.randint(0, 6))]
        for start in range(0, len(context), 7):
            lookup.extend(context[start : start + 7])
        copied = copy.deepcopy(lookup)
        counts = lookup.counts(suffix)
        assert counts == brute_force_followers(context + suffix, params["branch_length"], params["match_window"])
        copied.extend(suffix)
        assert counts == copied.counts()  # a suffix counts as if committed, and leaves the index as it was
        assert lookup.counts(suffix) == counts and len(lookup._tokens) == len(context)
    lookup = new_lookup("lookahead", {})
    lookup.extend([1, 2, 3, 1, 2, 4, 1, 2, 3, 9, -1, 7, 1, 2])
    assert lookup.counts() == {3: 2, 4: 1}  # after "1 2": 3 twice, 4 once
    assert lookup.propose()[:2] == [3, 1]  # the most frequent branch (a tie: the smaller id)
    assert lookup.counts([3, 9]) == {}  # after "9" came the image alone: an image is never proposed
    assert new_lookup("lookahead", {}).max_tokens == 12 and lookup_defaults("lookahead") == {
        "branch_length": 12, "match_window": 10}


def test_recycling_ranks_the_targets_last_top_tokens_after_the_last_token():
    lookup = new_lookup("recycling", {"output_topk": 3})
    lookup.extend([5, 6, 7])
    assert lookup.counts() == {} and lookup.propose() == []  # the target has verified nothing yet
    lookup.observe(7, [2, 9, 4, 8])  # the target's top tokens after 7, best first (kept: 3)
    lookup.observe(2, [7, -1, 3])
    assert lookup.counts() == {2: 3, 9: 2, 4: 1}
    assert lookup.counts([6, 2]) == {7: 3, 3: 1}  # an image id is never proposed
    assert lookup.propose() == [2, 7, 2]  # the greedy chain through the matrix, max_tokens long
    lookup.observe(7, [4])
    assert lookup.counts() == {4: 1}  # a row is overwritten by the target's latest
    assert lookup_defaults("recycling") == {"output_topk": 8, "shared": 0}
