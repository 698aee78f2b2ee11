"""The proposer contract: three required methods and nothing set on a proposer from outside; a
proposer that asks for the target's hidden states (as an EAGLE-style head draft would) gets
those its LM head read at each request's root and accepted tokens, and no forward computes
them when no proposer asks."""
from __future__ import annotations

import pytest
import torch

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import ChainProposer, Proposer
from pipeline.decoding.loop import speculative_decode
from pipeline.decoding.proposals import Pending, Proposal, Verified
from pipeline.drafting.methods import method_embeddings
from tests.test_batch_decoding import samples

CONFIG = DecodeConfig("M", gamma=3, max_new_tokens=12)


class HiddenReader(ChainProposer):
    """The chain's proposer, keeping what the target hands back after each block."""

    wants_target_hidden = True

    def start(self, rows) -> None:
        super().start(rows)
        self.seen: list[tuple[list[int], torch.Tensor]] = []

    def learn(self, proposal: Proposal, verified: Verified) -> Pending:
        self.seen.append((list(verified.accepted), verified.hidden.clone()))
        return super().learn(proposal, verified)


def test_a_proposer_must_start_propose_and_learn():
    class Half(Proposer):
        def start(self, rows):
            pass

    with pytest.raises(TypeError, match="learn"):
        Half(CONFIG)
    assert set(Proposer.__abstractmethods__) == {"start", "propose", "learn"}


def test_the_target_hands_back_the_hidden_states_of_each_requests_kept_tokens(tiny_pair, monkeypatch):
    target, draft = tiny_pair
    made: list[HiddenReader] = []
    monkeypatch.setattr("pipeline.decoding.loop.proposer_class",
                        lambda verify: lambda config: made.append(HiddenReader(config)) or made[-1])
    batch = samples(2)
    records = speculative_decode(target, draft, batch, CONFIG, engine="static")
    reader = made[0]
    assert len(reader.seen) >= max(r.blocks for r in records) - 1  # every block but the last learns
    for b, (sample, record) in enumerate(zip(batch, records)):
        ids = target.tokenize_prompt(sample.prompt)
        sequence = torch.cat([method_embeddings(target, "M", ids, sample.pixels()),
                              target.embed_tokens(torch.tensor(record.output_ids))])
        full = target.model(inputs_embeds=sequence[None], output_hidden_states=True).hidden_states[-1][0]
        produced = 0
        for accepted, hidden in reader.seen[: record.blocks - 1]:
            a = accepted[b]
            # the root is the token before the block's first output; then the accepted proposals
            start = sequence.shape[0] - len(record.output_ids) - 1 + produced
            torch.testing.assert_close(hidden[b, : a + 1], full[start : start + a + 1], atol=1e-4, rtol=1e-4)
            produced += a + 1


def test_no_forward_computes_hidden_states_unless_a_proposer_asks(tiny_pair, monkeypatch):
    target, draft = tiny_pair
    asked = []
    for model in (target, draft):
        plain = model.logits
        monkeypatch.setattr(model, "logits", lambda plain=plain, **kw: asked.append("hidden" in kw) or plain(**kw))
    speculative_decode(target, draft, samples(2), CONFIG)
    assert asked and not any(asked)
