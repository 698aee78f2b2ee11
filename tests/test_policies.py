"""Weight policies on hand-computed cases (pure tensors, no model)."""
from __future__ import annotations

import math

import pytest
import torch

from pipeline.drafting.policies import POLICIES, GridSearchPolicy, InverseErrorPolicy, StaticPolicy, WeightPolicy, make_policy
from pipeline.drafting.scoring import kl_divergence, mix, simplex_grid, total_variation


def dist(*values: float) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum()


def weights_after(pairs, policy: WeightPolicy) -> torch.Tensor:
    """w* after a history of (per-method q rows, p) positions, added one block per position."""
    state = policy.start(len(pairs[0][0]))
    for q_rows, p in pairs:
        state.update(torch.stack(q_rows)[None], p[None])
    return state.choose()


def test_simplex_grid_counts_and_order():
    assert simplex_grid(2, 10).shape == (11, 2)
    assert simplex_grid(4, 10).shape == (286, 4)
    assert torch.allclose(simplex_grid(2, 10)[:3], torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.2]], dtype=torch.float64))
    assert torch.allclose(simplex_grid(3, 10).sum(1), torch.ones(66, dtype=torch.float64))


def test_mix_is_a_probability_mixture_not_logits():
    q = torch.stack([dist(1, 0, 0), dist(0, 1, 0)])
    assert torch.allclose(mix(q, torch.tensor([0.25, 0.75], dtype=torch.float64)), dist(0.25, 0.75, 0))


def test_distances():
    p, q = dist(0.5, 0.5), dist(0.25, 0.75)
    assert kl_divergence(p, q).item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75), rel=1e-5)
    assert total_variation(p, q).item() == pytest.approx(0.25)
    # KL is target-first: KL(p||q) != KL(q||p)
    assert kl_divergence(p, q).item() != pytest.approx(kl_divergence(q, p).item())


def test_first_block_is_uniform_and_single_method_is_one():
    for kind in ("static", "grid", "inverse"):
        assert torch.equal(make_policy(kind).start(3).choose(), torch.full((3,), 1 / 3, dtype=torch.float64))
    assert torch.equal(GridSearchPolicy().start(1).choose(), torch.ones(1, dtype=torch.float64))
    assert not GridSearchPolicy().start(1).learns and not StaticPolicy().start(3).learns


def test_grid_hard_picks_the_method_that_matches_argmax():
    # method 0 always agrees with the target's argmax, method 1 never does
    pairs = [([dist(8, 1, 1), dist(1, 8, 1)], dist(6, 3, 1)) for _ in range(3)]
    w = weights_after(pairs, GridSearchPolicy(measure="hard"))
    # every candidate with w0 > 0.5 has full hits; ties resolve to the first: [1, 0]
    assert w.tolist() == [1.0, 0.0]


def test_grid_hard_plus_soft_breaks_hit_ties_by_kl():
    # mixture (0.3 + 0.4 w0, 0.5 - 0.4 w0, 0.2): argmax agrees with p for every w0 > 0.25,
    # and w0 = 0.5 reproduces p exactly (KL 0)
    p = dist(0.5, 0.3, 0.2)
    q0, q1 = dist(0.7, 0.1, 0.2), dist(0.3, 0.5, 0.2)
    positions = [([q0, q1], p)]
    assert weights_after(positions, GridSearchPolicy(measure="hard")).tolist() == [1.0, 0.0]
    assert weights_after(positions, GridSearchPolicy(measure="hard+soft")).tolist() == [0.5, 0.5]


def test_hard_plus_soft_never_trades_hits_for_kl():
    # position 1 favours w0 = 0.5 by KL; position 2 needs w0 >= 0.7 for a hit
    p1, q01, q11 = dist(0.5, 0.3, 0.2), dist(0.7, 0.1, 0.2), dist(0.3, 0.5, 0.2)
    # target picks token 0 at position 2: 0.05 w0 + 0.9 (1 - w0) beats token 1 iff w0 < 0.47
    p2, q02, q12 = dist(0.9, 0.1, 1e-6), dist(0.05, 0.95, 1e-6), dist(0.9, 0.1, 1e-6)
    positions = [([q01, q11], p1), ([q02, q12], p2)]
    w_hs = weights_after(positions, GridSearchPolicy(measure="hard+soft"))
    # hits: w0 in (0.25, 0.47) hits both positions -> {0.3, 0.4}; KL then picks among them
    assert w_hs.tolist()[0] in (0.3, 0.4)
    w_soft = weights_after(positions, GridSearchPolicy(measure="soft"))
    mixed = torch.einsum("hmv,cm->chv", torch.stack([torch.stack([q01, q11]), torch.stack([q02, q12])]).double(), simplex_grid(2, 10))
    kl = kl_divergence(torch.stack([p1, p2]).double(), mixed).sum(-1)
    assert w_soft.tolist() == simplex_grid(2, 10)[int(torch.argmin(kl))].tolist()


def test_grid_soft_with_tvd_vs_kl_differ_by_hand():
    # q0 = (1, 0), q1 = (0, 1): the mixture is (w0, 1 - w0). Targets (0.8, 0.2) twice, (0.3, 0.7) once.
    # TVD sum = 2|0.8 - w0| + |0.3 - w0| is least at w0 = 0.8; summed KL is least at w0 = 1.9/3 -> grid 0.6.
    q = [dist(1, 0), dist(0, 1)]
    positions = [(q, dist(0.8, 0.2)), (q, dist(0.8, 0.2)), (q, dist(0.3, 0.7))]
    assert weights_after(positions, GridSearchPolicy(measure="soft", distance="tvd")).tolist() == [0.8, 0.2]
    assert weights_after(positions, GridSearchPolicy(measure="soft", distance="kl")).tolist() == [0.6, 0.4]


def test_window_only_sees_the_last_h_positions():
    good0 = ([dist(8, 1, 1), dist(1, 8, 1)], dist(6, 3, 1))  # method 0 right
    good1 = ([dist(8, 1, 1), dist(1, 8, 1)], dist(1, 6, 3))  # method 1 right
    positions = [good0, good0, good0, good1]
    assert weights_after(positions, GridSearchPolicy(measure="hard", window=None)).tolist()[0] > 0.5
    assert weights_after(positions, GridSearchPolicy(measure="hard", window=1)).tolist()[1] > 0.5


def test_inverse_error_weights_by_hand():
    p = dist(0.5, 0.5)
    q0, q1 = dist(0.25, 0.75), dist(0.5 - 0.125, 0.5 + 0.125)  # TVD 0.25 and 0.125
    w = weights_after([([q0, q1], p)], InverseErrorPolicy(distance="tvd", temperature=1.0))
    assert w.tolist() == pytest.approx([1 / 3, 2 / 3])  # (1/e) normalised: 4 : 8
    w2 = weights_after([([q0, q1], p)], InverseErrorPolicy(distance="tvd", temperature=0.5))
    assert w2.tolist() == pytest.approx([1 / 5, 4 / 5])  # (1/e)^2: 16 : 64


def test_inverse_error_zero_errors():
    p = dist(0.5, 0.5)
    assert weights_after([([p, p], p)], InverseErrorPolicy()).tolist() == [0.5, 0.5]
    one_zero = [([p, dist(0.9, 0.1), p], p)]
    assert weights_after(one_zero, InverseErrorPolicy(distance="tvd")).tolist() == [0.5, 0.0, 0.5]


def test_equal_mixtures_tie_to_the_first_candidate_despite_rounding():
    # identical methods: every candidate mixes to the same distribution; rounding noise in the
    # scores must not pick the winner
    q = dist(0.3, 0.2, 0.5)
    noisy = q + torch.tensor([1e-8, -1e-8, 0.0])
    positions = [([q, noisy], dist(0.2, 0.3, 0.5))]
    for measure in ("soft", "hard+soft"):
        assert weights_after(positions, GridSearchPolicy(measure=measure)).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("spec", [
    GridSearchPolicy(measure="hard+soft"),
    GridSearchPolicy(measure="soft", distance="tvd", window=4),
    GridSearchPolicy(measure="hard", window=1),
    InverseErrorPolicy(temperature=0.5, window=6),
])
def test_incremental_history_equals_scoring_the_whole_window(spec):
    # The history scores each position once as blocks arrive; the weights must be those of
    # scoring the whole window at once (the definition in docs/algorithm.md §3), for m = 4 (286 candidates).
    gen = torch.Generator().manual_seed(0)
    m, vocab, blocks = 4, 50, [3, 1, 5, 2, 4]
    q = torch.softmax(3 * torch.randn(sum(blocks), m, vocab, generator=gen), -1)
    p = torch.softmax(3 * torch.randn(sum(blocks), vocab, generator=gen), -1)
    state, start = spec.start(m), 0
    for n in blocks:
        state.update(q[start:start + n], p[start:start + n])
        start += n
        lo = 0 if spec.window is None else max(0, start - spec.window)
        qw, pw = q[lo:start].double(), p[lo:start].double()
        if isinstance(spec, GridSearchPolicy):
            candidates = simplex_grid(m, 10)
            mixed = torch.einsum("hmv,cm->chv", qw, candidates)
            hits = (mixed.argmax(-1) == pw.argmax(-1)).sum(-1)
            distance = kl_divergence if spec.measure == "hard+soft" or spec.distance == "kl" else total_variation
            dist = distance(pw, mixed).sum(-1)
            if spec.measure == "hard":
                expected = candidates[int(torch.nonzero(hits == hits.max())[0])]
            else:
                eligible = hits == hits.max() if spec.measure == "hard+soft" else torch.ones_like(hits, dtype=torch.bool)
                dist = torch.where(eligible, dist, torch.inf)
                # ties within float noise (relative 1e-5) go to the earliest candidate
                expected = candidates[int(torch.nonzero(dist <= dist.min() * (1 + 1e-5) + 1e-7)[0])]
            assert state.choose().tolist() == expected.tolist()
        else:
            errors = kl_divergence(pw[:, None], qw).sum(0)
            expected = (1 / errors) ** (1 / spec.temperature)
            assert state.choose().tolist() == pytest.approx((expected / expected.sum()).tolist(), rel=1e-5)


def _authors_first_tied(pairs, m: int, steps: int = 10) -> list[float]:
    """The authors' rule, written from its description: candidates in `itertools.product`
    order over 0, 1/n, ..., 1 (the first method's weight rising slowest), those summing to 1;
    the first with the most argmax hits over the history wins."""
    import itertools

    order = [w for w in itertools.product(range(steps + 1), repeat=m) if sum(w) == steps]
    def hits(w):
        return sum(int(mix(torch.stack(q), torch.tensor(w, dtype=torch.float64) / steps).argmax() == p.argmax())
                   for q, p in pairs)
    best = max(hits(w) for w in order)
    return [x / steps for x in next(w for w in order if hits(w) == best)]


@pytest.mark.parametrize("case", ["m wins", "nothing hits", "three methods"])
def test_grid_tie_first_takes_the_authors_first_tied_candidate(case):
    """Hit-count ties are the rule under `hard`: `tie: first` takes the first tied candidate in
    the authors' order (the least weight on M; all weight on the last method when nothing hits),
    the default `most_m` the most weight on M."""
    if case == "m wins":
        pairs = [([dist(8, 1, 1), dist(1, 8, 1)], dist(6, 3, 1)) for _ in range(3)]
    elif case == "nothing hits":
        pairs = [([dist(8, 1, 1), dist(1, 8, 1)], dist(1, 1, 8)) for _ in range(2)]
    else:
        pairs = [([dist(8, 1, 1), dist(1, 8, 1), dist(1, 1, 8)], dist(6, 3, 1)),
                 ([dist(1, 8, 1), dist(8, 1, 1), dist(1, 1, 8)], dist(3, 6, 1))]
    m = len(pairs[0][0])
    first = weights_after(pairs, GridSearchPolicy(measure="hard", tie="first")).tolist()
    assert first == pytest.approx(_authors_first_tied(pairs, m))
    most_m = weights_after(pairs, GridSearchPolicy(measure="hard")).tolist()
    assert first != most_m and most_m[0] >= first[0]
    if case == "nothing hits":
        assert first == [0.0, 1.0] and most_m == [1.0, 0.0]


def test_grid_tie_rule_is_validated_labelled_and_keeps_todays_keys():
    with pytest.raises(ValueError, match="tie rule 'last'"):
        GridSearchPolicy(tie="last").validate()
    assert GridSearchPolicy(tie="first").label == "grid(hard+soft, tie first)"
    assert "tie" not in GridSearchPolicy().key_fields()  # runs written before the choice resume
    assert GridSearchPolicy(tie="first").key_fields()["tie"] == "first"


def test_each_policy_knows_its_label_and_which_knobs_matter():
    assert set(POLICIES) >= {"static", "grid", "inverse"}
    assert [make_policy(k).label for k in ("static", "grid", "inverse")] == ["static", "grid(hard+soft)", "inverse(T=1)"]
    # static reads neither window nor distance; a hits-based grid ignores the distance
    assert StaticPolicy(window=4, distance="tvd").canonical() == StaticPolicy()
    assert GridSearchPolicy(measure="hard", distance="tvd").canonical() == GridSearchPolicy(measure="hard")
    assert GridSearchPolicy(measure="soft", distance="tvd").canonical().distance == "tvd"
    assert InverseErrorPolicy(distance="tvd", window=3).canonical() == InverseErrorPolicy(distance="tvd", window=3)


def test_a_new_policy_is_one_subclass():
    """Defining a subclass registers it by kind: grid files and the decoder can use it at once."""
    from dataclasses import dataclass

    from pipeline.drafting.weight_states import FixedWeights

    @dataclass(frozen=True)
    class FirstMethodOnly(WeightPolicy, kind="test-first-only"):
        def start_state(self, initial):
            return FixedWeights(torch.nn.functional.one_hot(torch.tensor(0), len(initial)).double())

    try:
        assert make_policy("test-first-only").start(3).choose().tolist() == [1.0, 0.0, 0.0]
        with pytest.raises(ValueError, match="defined twice"):
            type("Again", (WeightPolicy,), {}, kind="test-first-only")
    finally:
        POLICIES.pop("test-first-only")
