"""The rows of a state-space draft: a roll-back is bitwise the state of a run that never went
further; a left-padded row is the row alone; a candidate tree's groups continue the accepted one;
a tree level read by batch expansion gives each node what a row fed its path gives, and a row
settles on an accepted node's state; one token per forward, so Mamba (v1)'s multi-token restart
never reaches the engine. The first
test is the canary for the non-public transformers cache fields the adapter reads: if it fails
after a transformers upgrade, `pipeline/models/recurrent.py` is the one place to fix."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from pipeline.decoding.engine import new_rows
from pipeline.models.base import ModelInputError
from pipeline.models.loading import ModelLoadError, load_model, load_pair
from pipeline.models.recurrent import RecurrentLlava, RecurrentLM
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid

KINDS = ("mamba", "mamba2")


@pytest.fixture(autouse=True)
def inference():
    """As the engine decodes: the models' states are inference tensors, updated in place."""
    with torch.inference_mode():
        yield


@pytest.fixture(scope="module", params=KINDS)
def draft(request, tiny_dirs):
    return load_model(tiny_dirs[f"{request.param}_draft"])


PROMPTS = [torch.randint(5, 300, (n,), generator=torch.Generator().manual_seed(n)) for n in range(1, 9)]


def rows_of(model, lengths=(7, 4), span=8, per_request=1):
    """Rows of fixed prompts of the given lengths (left-padded to the longest)."""
    prompts = [model.embed_tokens(PROMPTS[n - 1]) for n in lengths]
    rows = new_rows(model, prompts, engine="static", capacity=32, role="draft", span=span, per_request=per_request)
    rows.prefill()
    return rows


def test_the_cache_fields_the_adapter_reads_are_there(draft):
    """Canary, pinned to the transformers range pyproject.toml allows (>=5.24,<6)."""
    major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
    assert (major, minor) >= (5, 24) and major < 6
    rows = rows_of(draft)
    assert {type(layer).__name__ for layer in rows.cache.layers} == {"LinearAttentionLayer"}
    states = draft.state_tensors(rows.cache)
    assert len(states) == 2 * len(rows.cache.layers) and all(s.shape[0] == rows.rows for s in states)
    before = [s.clone() for s in states]
    addresses = [s.data_ptr() for s in states]
    rows.feed([11])
    after = draft.state_tensors(rows.cache)
    assert [s.data_ptr() for s in after] == addresses  # updated in place: the saved states restore into them
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


def test_a_roll_back_is_bitwise_the_state_of_a_run_that_never_went_further(draft):
    rows, straight = rows_of(draft), rows_of(draft)
    rows.feed([21, 22, 23, 24, 25])
    rows.settle([2] * rows.rows)
    rolled = rows.feed([31, 32, 33], keep=3)
    straight.feed([21, 22])
    assert torch.equal(rolled, straight.feed([31, 32, 33], keep=3))
    with pytest.raises(ValueError, match="only 3 were fed"):
        rows.settle([9] * rows.rows)
    deep = rows_of(draft, span=2)  # a ring of 4 saved states
    deep.feed(list(range(40, 50)))
    with pytest.raises(ValueError, match="saved states reach back"):
        deep.settle([1] * deep.rows)


def test_fillers_leave_a_row_where_the_block_began(draft):
    """A request with one pending token beside one with two is right-aligned behind a filler:
    its row's state is as if the filler was never fed."""
    rows, alone = rows_of(draft, lengths=(5, 5)), rows_of(draft, lengths=(5,))
    fed = rows.feed(torch.tensor([[99, 7], [6, 7]]), keep=1, valid=[1, 2])
    assert torch.allclose(fed[0], alone.feed([7], keep=1)[0], atol=1e-5)  # two rows round apart from one
    rows.settle([1, 2])
    assert torch.allclose(rows.feed([8])[0], alone.feed([8])[0], atol=1e-5)


def test_a_tree_level_read_by_expansion_is_each_path_fed_as_a_row(draft):
    rows = rows_of(draft, lengths=(5, 5), per_request=2)  # one request, two method rows
    rows.feed([30])
    rows.begin_tree()
    first = rows.feed_level(torch.tensor([[41, 42]]), torch.tensor([[0, 0]]))  # [1, 2 nodes, 2 rows, V]
    second = rows.feed_level(torch.tensor([[51, 52, 53]]), torch.tensor([[1, 1, 0]]))
    path = rows_of(draft, lengths=(5, 5))
    chain = path.feed([30, 42, 52], keep=2)  # node 42 at level 1, its child 52 at level 2
    assert torch.allclose(first[0, 1], chain[:, 0], atol=1e-5) and torch.allclose(second[0, 1], chain[:, 1], atol=1e-5)
    # keep the pending token and the path 42 -> 52: block positions 0, then the level slots 1 + 1, 1 + 2 + 1
    rows.settle([3, 3], torch.tensor([[0, 2, 4]] * 2))
    assert torch.allclose(rows.feed([60])[:, -1], path.feed([60])[:, -1], atol=1e-5)


def test_a_left_padded_row_is_the_row_alone_and_one_token_steps_are_a_full_forward(draft):
    """The second half guards the Mamba (v1) trap: its cached multi-token forward restarts the
    scan from zero; feeding [a, b] must give what one forward over the whole sequence gives."""
    padded, alone = rows_of(draft, lengths=(7, 4)), rows_of(draft, lengths=(4,))
    fed = alone.feed([7, 8], keep=2)[0]
    assert torch.allclose(padded.feed([7, 8], keep=2)[1], fed, atol=1e-5)
    sequence = torch.cat([PROMPTS[3], torch.tensor([7, 8])])
    whole = draft.logits(cache=draft.new_cache(), attention_mask=None, inputs_embeds=draft.embed_tokens(sequence)[None], keep=2)
    assert torch.allclose(fed, whole[0], atol=1e-5)


def test_a_candidate_trees_groups_continue_the_accepted_one(draft):
    rows, source_alone = rows_of(draft, lengths=(5, 5, 5)), rows_of(draft, lengths=(5,))
    rows.feed(torch.tensor([[41, 42], [51, 52], [61, 62]]))
    rows.copy_rows(3, torch.tensor([1]), 0)
    source_alone.feed([51, 52])
    continued = rows.feed([70], keep=1)
    expected = source_alone.feed([70], keep=1)[0]
    assert all(torch.allclose(continued[row], expected, atol=1e-5) for row in range(3))
    rows.settle([1] * rows.rows)  # the states saved in the block were copied too
    assert torch.allclose(rows.feed([52, 70], keep=1)[2], expected, atol=1e-5)


def test_what_a_state_space_model_cannot_do_is_refused_by_name(draft, tiny_dirs, tmp_path):
    with pytest.raises(ModelInputError, match="2-D padding mask"):
        draft.logits(cache=draft.new_cache(), attention_mask=torch.zeros(2, 1, 3, 3), input_ids=torch.ones(2, 3, dtype=torch.long))
    assert isinstance(draft, RecurrentLlava)
    with pytest.raises(ModelLoadError, match="can only be a draft"):
        load_pair(tiny_dirs["mamba_draft"], tiny_dirs["bigram_target"])
    raw = {"name": "g", "datasets": ["embedded_vqa"], "methods": ["AR", "MT"]}
    with pytest.raises(GridError, match=r"pairs\[0\].target: .*can only be a draft"):
        parse_grid(raw | {"pairs": [{"target": "tiny:mamba2_draft", "draft": "tiny:draft"}]})
    # every verify kind drafts with it: a tree's levels are read by batch expansion
    assert parse_grid(raw | {"pairs": [{"target": "tiny:bigram_target", "draft": "tiny:mamba_draft"}],
                             "verify": ["chain", "candidates", {"kind": "dynamic"}], "batch": [1, 3]}).pairs


def test_plain_mamba_checkpoints_draft_text_and_hybrids_are_refused(tiny_dirs, tmp_path):
    """A Mamba(2)ForCausalLM loads as a text draft (never through the attention adapter, which
    would drop its state silently); a checkpoint mixing attention and Mamba layers is refused."""
    from transformers import JambaConfig, JambaForCausalLM, Mamba2ForCausalLM

    from pipeline.models.tiny import build_tokenizer
    from pipeline.models.tiny_ssm import text_config

    tokenizer = build_tokenizer()
    plain = Mamba2ForCausalLM(text_config("mamba2", tokenizer, 32))
    plain.save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    assert isinstance(load_model(str(tmp_path / "plain"), allow_text=True), RecurrentLM)
    hybrid = JambaForCausalLM(JambaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
                                          num_attention_heads=2, num_key_value_heads=1, num_experts=1,
                                          mamba_d_state=4, mamba_expand=2, use_mamba_kernels=False))
    hybrid.save_pretrained(tmp_path / "hybrid")
    tokenizer.save_pretrained(tmp_path / "hybrid")
    with pytest.raises(ModelLoadError, match="not one this engine rolls back"):
        load_model(str(tmp_path / "hybrid"), allow_text=True)
    assert json.loads((tmp_path / "hybrid" / "config.json").read_text())["model_type"] == "jamba"
    raw = {"name": "g", "datasets": ["embedded_vqa"], "methods": ["AR", "T"]}
    with pytest.raises(GridError, match="mixes attention and state-space layers"):
        parse_grid(raw | {"pairs": [{"target": "tiny:target", "draft": str(tmp_path / "hybrid"), "text_only": True}]})
