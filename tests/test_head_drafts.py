"""Head drafts (EAGLE-1/2's, EAGLE-3's, MSD's, ViSpec's and Medusa's layouts) through the drafter
seam: each tiny head loads from exactly the files its reference code writes (EAGLE-3's also in the
speculators format);
greedy SD with it is the target's own greedy output for every verify kind, batch 1 and 3, both
engines; its proposals are its paper's (an uncached reference loop, written here from the
algorithm, accepts what the decoder accepts, and EAGLE-2's tree is the reference's); sampling keeps
the target's distribution; a mismatched head is refused before anything loads."""
from __future__ import annotations

import functools
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.drafting.methods import method_embeddings
from pipeline.models.families import TINY_FAMILIES
from pipeline.models.heads import HeadMismatch, load_head
from pipeline.models.loading import load_model
from pipeline.models.tiny_heads import build_eagle_head
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid
from pipeline.planning.verify_entries import make_verify
from tests.conftest import solid

MAX_NEW = 24
# every verify kind a head drafts: one method, so a candidate tree is its chain
VERIFY = ("chain", "candidates", {"kind": "dynamic", "nodes": 8, "top_k": 3}, {"kind": "shape", "shape": [3, 2, 1]},
          "bandit", {"kind": "eagle2", "depth": 3, "top_k": 8, "total_tokens": 30})
EAGLE_KINDS = ("eagle", "eagle3", "msd", "vispec")  # heads with a layer and a cache of their own
KINDS = (*EAGLE_KINDS, "medusa")
# the layouts the reference code writes (SafeAILab/EAGLE `cnets1.py`, `cnets.py`, KangJialiang/ViSpec
# `cnets_ours.py`): EAGLE-1/2's layer 0 has no input norm and the head no final norm; ViSpec adds its
# image adaptor and img_fc; EAGLE-3's layer reads [embedding; state], and the head has its own norm,
# LM head and vocabulary maps
LAYER = {*(f"self_attn.{p}_proj.weight" for p in "qkvo"), *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}
PUBLISHED = {
    "eagle": {"fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight", *(f"layers.0.{w}" for w in LAYER)},
    "msd": {"fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight", *(f"layers.0.{w}" for w in LAYER)},
    "vispec": {"fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight", *(f"layers.0.{w}" for w in LAYER),
               "imadpt.q", "imadpt.k_proj.weight", "imadpt.v_proj.weight", "imadpt.o_proj.weight", "img_fc.weight",
               "img_fc.bias"},
    # Medusa's code saves its heads alone: head k's residual block, then its projection
    "medusa": {name for k in range(4) for name in (f"{k}.0.linear.weight", f"{k}.0.linear.bias", f"{k}.1.weight")},
    "eagle3": {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", *(f"midlayer.{w}" for w in LAYER),
               *(f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"))},
}


def prompts(n: int) -> list[Sample]:
    """Requests of different lengths and images, so a batch is left-padded."""
    words = ["Describe the image.", "What colour is the shape in this picture?", "What is this?"]
    colours = [(200, 30, 30), (20, 90, 210), (30, 160, 60)]
    return [Sample("unit", "test", i, "first", f"USER: <image>\n{words[i % 3]} ASSISTANT:", (solid(colours[i % 3]),))
            for i in range(n)]


@pytest.fixture(scope="module", params=KINDS)
def bigram(request, tiny_dirs):
    target = load_model(tiny_dirs["bigram_target"])
    return target, load_head(request.param, tiny_dirs[f"{request.param}_head"], target)


@pytest.fixture(scope="module", params=EAGLE_KINDS)
def bigram_eagle(request, tiny_dirs):
    target = load_model(tiny_dirs["bigram_target"])
    return target, load_head(request.param, tiny_dirs[f"{request.param}_head"], target)


def test_tiny_medusa_heads_are_written_in_medusas_own_files(tiny_dirs):
    folder = Path(tiny_dirs["medusa_head"])
    weights = torch.load(folder / "medusa_lm_head.pt", weights_only=True)
    config = json.loads((folder / "config.json").read_text())
    assert set(weights) == PUBLISHED["medusa"] and (config["medusa_num_heads"], config["medusa_num_layers"]) == (4, 1)
    assert weights["0.1.weight"].shape == (384, 64)  # the target's vocabulary and width


@pytest.mark.parametrize("kind", EAGLE_KINDS)
def test_the_tiny_heads_are_written_in_their_reference_codes_layouts(tiny_dirs, kind):
    folder = Path(tiny_dirs[f"{kind}_head"])
    weights = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    assert set(weights) == PUBLISHED[kind] and config["num_hidden_layers"] == 1
    hidden, reads = config["hidden_size"], 3 if kind == "eagle3" else 2
    assert weights["fc.weight"].shape == (hidden, reads * hidden) and config["bias"] is (kind != "eagle3")
    if kind == "eagle3":  # its own vocabulary: the target's ordinary tokens, mapped back by d2t
        drafted = config["draft_vocab_size"]
        assert weights["lm_head.weight"].shape == (drafted, hidden) and drafted < config["vocab_size"]
        assert int(weights["t2d"].sum()) == drafted and bool(weights["d2t"].any())
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    if kind == "vispec":  # the target's own config with one layer; its query count only in `imadpt.q`
        assert weights["imadpt.q"].shape == (2, 4, 16) and weights["img_fc.weight"].shape == (hidden, 2 * hidden)
        assert config["architectures"] == ["LlavaForConditionalGeneration"] and "num_q" not in config


def test_an_eagle3_head_in_the_speculators_format_loads_the_same(tiny_dirs, tmp_path):
    """speculators' rename: the layer's config nested under `transformer_layer_config`, the layer's
    weights under `layers.0.` instead of `midlayer.`; the head drafts exactly as EAGLE's files do."""
    folder = Path(tiny_dirs["eagle3_head"])
    config = json.loads((folder / "config.json").read_text())
    head_keys = ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "bias")
    speculators = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                   "transformer_layer_config": {k: v for k, v in config.items() if k not in head_keys},
                   **{k: config[k] for k in head_keys}, "speculators_config": {"algorithm": "eagle3"}}
    renamed = tmp_path / "speculators"
    renamed.mkdir()
    (renamed / "config.json").write_text(json.dumps(speculators))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in load_file(folder / "model.safetensors").items()},
              renamed / "model.safetensors")
    target = load_model(tiny_dirs["bigram_target"])
    config = DecodeConfig("M", gamma=3, max_new_tokens=MAX_NEW)
    records = [speculative_decode(target, load_head("eagle3", str(path), target), prompts(2), config)
               for path in (folder, renamed)]
    assert [r.accepted_per_block for r in records[0]] == [r.accepted_per_block for r in records[1]]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["static", "eager"])
def test_greedy_sd_with_a_head_is_the_targets_own_greedy_output(bigram, engine):
    """Every verify kind, gamma 1/3/5 on chains, batch 1 and 3; blocks accept none, some and all
    (of 3 at least)."""
    target, head = bigram
    batch = prompts(3)
    reference = [r.output_ids for r in autoregressive_decode(target, batch, max_new_tokens=MAX_NEW, engine=engine)]
    accepted = []
    for verify in VERIFY:
        spec = make_verify(verify)
        for gamma in ((1, 3, 5) if spec.is_chain else (3,)):
            config = DecodeConfig("M", gamma=gamma, max_new_tokens=MAX_NEW, verify=spec)
            config = replace(config, gamma=spec.settled(1, gamma)[1], verify=spec.settled(1, gamma)[0])
            alone = [speculative_decode(target, head, [s], config, engine=engine)[0] for s in batch]
            together = speculative_decode(target, head, batch, config, engine=engine)
            for one, many, ar in zip(alone, together, reference):
                assert one.output_ids == ar == many.output_ids, (verify, gamma)
                assert one.accepted_per_block == many.accepted_per_block, (verify, gamma)  # batching changes nothing
                accepted += [(a, config.gamma) for a in one.accepted_per_block]
    assert any(a == 0 for a, _ in accepted) and any(0 < a < g for a, g in accepted)
    assert any(a == g >= 3 for a, g in accepted)


def image_rows(target, ids: list[int], images) -> torch.Tensor:
    """`[L]` bool: which rows of the spliced prompt of `ids` are image feature rows (the prompt's
    image placeholders, each replaced by its image's rows), counted here from the features."""
    counts = iter(f.shape[0] for f in target.image_features(images))
    return torch.tensor([flag for t in ids for flag in ([True] * next(counts) if t == target.image_token_id
                                                           else [False])])


def target_states(target, head, sequence: torch.Tensor) -> torch.Tensor:
    """The target's states a head reads at every position of `sequence`: its `target_layers`
    of transformers' own `hidden_states`, side by side."""
    states = target.model(inputs_embeds=sequence[None], output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in head.target_layers], -1)


def greedy_block(target, sequence: torch.Tensor, drafted: list[int]) -> list[int]:
    """The target's own greedy tokens after `sequence`, as far as `drafted` matches them, and
    the target's token after the last match (a block's output under greedy verification)."""
    greedy_after = lambda rows: int(target.model(inputs_embeds=rows[None]).logits[0, -1].argmax())
    block = [greedy_after(sequence)]
    for proposal in drafted:
        if proposal != block[-1]:
            break
        block.append(greedy_after(torch.cat([sequence, target.embed_tokens(torch.tensor(block))])))
    return block


def reference_rows(head, sequence: torch.Tensor, features: torch.Tensor,
                   visual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The head's rows over `sequence` (token p beside `features[p]`, the target's before it),
    their positions and ViSpec's image summary, as the reference code builds them: ViSpec's
    with each image span cut out but for its first `num_q - 1` adapted vectors, set at the
    span's last positions, and every text row fused with the summary of the last image before
    it; MSD's image rows unfused; EAGLE's all fused alike."""
    if head.kind != "vispec":
        return head.fuse_prompt(sequence, features, visual).rows, torch.arange(len(sequence)), None
    module, summary = head.model, torch.zeros(sequence.shape[-1], dtype=sequence.dtype)
    rows, positions, p = [], [], 0
    while p < len(sequence):
        if not visual[p]:
            mixed = module.img_fc(torch.cat([features[p].to(sequence.dtype), summary]))
            rows.append(module.fc(torch.cat([sequence[p], mixed])))
            positions.append(p)
            p += 1
            continue
        end = p + int(visual[p:].long().cumprod(0).sum())  # the span's end
        adapted = module.imadpt(sequence[p:end])
        rows += list(adapted[:-1])
        positions += range(end - len(adapted) + 1, end)
        summary, p = adapted[-1], end
    return torch.stack(rows), torch.tensor(positions), summary


def head_states(head, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The head's predicted features after each of `rows`, read causally with no cache."""
    n = rows.shape[0]
    mask = torch.full((n, n), torch.finfo(rows.dtype).min, dtype=rows.dtype).triu(1)[None, None]
    ids = positions[None] if positions.dim() == 1 else positions[:, None]  # plain, or M-RoPE's [3, n]
    return head.model(inputs_embeds=rows[None], attention_mask=mask, position_ids=ids, cache=DynamicCache())[0]


def eagle_reference(target, head, sample: Sample, gamma: int) -> list[int]:
    """EAGLE-1's chain written from the algorithm, with no cache, in the decoder's block order: a
    block starts at the last token known; the head reads the whole sequence again (token p beside
    the target's last hidden state at p - 1, `reference_rows`), drafts `gamma` tokens on its own
    predictions, and the target keeps its greedy tokens. Accepted proposals of each block that
    had room for `gamma` proposals and the target's token after them."""
    ids = target.tokenize_prompt(sample.prompt)
    prompt = method_embeddings(target, "M", ids, sample.pixels())
    visual = image_rows(target, ids, sample.pixels())  # MSD and ViSpec read these apart
    output, accepted = [], []
    lm_head = lambda states: head.model.next_logits(states, target.model.get_output_embeddings())
    with torch.no_grad():
        while len(output) + gamma + 1 <= MAX_NEW:
            sequence = torch.cat([prompt, target.embed_tokens(torch.tensor(output, dtype=torch.long))])
            features = target_states(target, head, sequence)
            read = torch.cat([visual, torch.zeros(len(output), dtype=torch.bool)])[1:]
            rows, positions, summary = reference_rows(head, sequence[1:], features[:-1], read)
            drafted = []
            for _ in range(gamma):
                states = head_states(head, rows, positions)
                drafted.append(int(lm_head(states[-1]).argmax()))
                token = target.embed_tokens(torch.tensor(drafted[-1:]))
                rows = torch.cat([rows, head.model.fuse(token, states[-1:], summary)])
                positions = torch.cat([positions, positions[-1:] + 1])
            block = greedy_block(target, sequence, drafted)
            accepted.append(len(block) - 1)
            output += block
    return accepted


def medusa_reference(target, head, sample: Sample, gamma: int) -> list[int]:
    """Medusa's chain from the algorithm: at each block every proposal reads the target's state
    before the last token known, proposal i from head i; the target keeps its greedy tokens."""
    ids = target.tokenize_prompt(sample.prompt)
    prompt = method_embeddings(target, "M", ids, sample.pixels())
    output, accepted = [], []
    with torch.no_grad():
        while len(output) + gamma + 1 <= MAX_NEW:
            sequence = torch.cat([prompt, target.embed_tokens(torch.tensor(output, dtype=torch.long))])
            state = target_states(target, head, sequence)[-2]  # before the last token known
            drafted = [int(head.model[k](state).argmax()) for k in range(gamma)]
            block = greedy_block(target, sequence, drafted)
            accepted.append(len(block) - 1)
            output += block
    return accepted


def test_the_heads_proposals_are_their_papers(bigram):
    """fp64, eager: the decoder's accepted counts per block are the uncached reference's."""
    target, head = bigram
    for model in (target, head):
        model.model.double()
        model.dtype = torch.float64
    try:
        for sample in prompts(2):
            for gamma in (2, 4):
                config = DecodeConfig("M", gamma=gamma, max_new_tokens=MAX_NEW)
                live = speculative_decode(target, head, [sample], config, engine="eager")[0]
                written = medusa_reference if head.drafter == "medusa" else eagle_reference
                reference = written(target, head, sample, gamma)
                assert len(reference) >= 3 and live.accepted_per_block[: len(reference)] == reference
    finally:
        for model in (target, head):
            model.model.float()
            model.dtype = torch.float32


def test_a_head_is_refused_by_a_target_it_was_not_trained_for(tiny_dirs, tmp_path):
    """Named with both, in the grid, before anything loads (under 2 s), and again at load."""
    config = json.loads((Path(tiny_dirs["eagle_head"]) / "config.json").read_text())
    wrong = tmp_path / "wrong_head"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    save_file(load_file(Path(tiny_dirs["eagle_head"]) / "model.safetensors"), wrong / "model.safetensors")
    grid = {"datasets": ["embedded_vqa"], "methods": ["AR", "M"],
            "pairs": [{"target": tiny_dirs["bigram_target"], "draft": {"head": "eagle", "path": str(wrong)}}]}
    start = time.monotonic()
    with pytest.raises(GridError, match=r"pairs\[0\]\.draft: eagle head .*wrong_head.* hidden_size 32 but target "
                                        r".*bigram_target.* has 64"):
        parse_grid(grid)
    assert time.monotonic() - start < 2
    with pytest.raises(HeadMismatch, match="hidden_size 32"):
        load_head("eagle", str(wrong), load_model(tiny_dirs["bigram_target"]))
    # an EAGLE-3 head reading layers the target does not have
    config = json.loads((Path(tiny_dirs["eagle3_head"]) / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [1, 2, 5]}))
    with pytest.raises(GridError, match=r"eagle3 head .*wrong_head.* reads layers \[5\] but target .*bigram_target.* "
                                        r"has 2 \(hidden states 0 to 2\)"):
        parse_grid({**grid, "pairs": [{"target": tiny_dirs["bigram_target"],
                                       "draft": {"head": "eagle3", "path": str(wrong)}}]})
    config.pop("eagle_aux_hidden_state_layer_ids")  # EAGLE's default (2, L // 2, L - 3) needs six layers
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(GridError, match="need a target of six layers or more, not 2"):
        parse_grid({**grid, "pairs": [{"target": tiny_dirs["bigram_target"],
                                       "draft": {"head": "eagle3", "path": str(wrong)}}]})


def test_a_head_pair_runs_ar_and_m_and_only_live(tiny_dirs):
    """A head reads the target's own prompt (M alone), and drafts from its own guesses, which no
    teacher-forced replay makes: its rows run live; the separate draft's still replay."""
    from pipeline.planning.shards import decode_mode

    grid = {"datasets": ["embedded_vqa"], "methods": ["AR", "M", "T", "MT"], "mode": "auto",
            "pairs": [{"target": "tiny:bigram_target", "draft": "tiny:eagle_head"},
                      {"target": "tiny:bigram_target", "draft": "tiny:mamba_draft"}]}
    spec = parse_grid(grid)
    by_draft = {}
    for config in spec.configs():
        by_draft.setdefault(config.pair.draft, set()).add((config.decode.methods, decode_mode(config, "auto")))
    assert by_draft["tiny:eagle_head"] == {("AR", "replay"), ("M", "live")}
    assert {mode for methods, mode in by_draft["tiny:mamba_draft"] if methods != "AR"} == {"replay"}
    with pytest.raises(GridError, match="mode 'replay' cannot score head drafts"):
        parse_grid({**grid, "mode": "replay"})
    with pytest.raises(GridError, match="tiny:eagle_head drafts for tiny:bigram_target"):
        parse_grid({**grid, "pairs": [{"target": "tiny:target", "draft": "tiny:eagle_head"}]})


@functools.lru_cache(maxsize=None)
def word_head(kind: str):
    """test_sampling's 11-word target with a random `kind` head of its shape, far from it
    (EAGLE-3's drafting 9 of the 11 words)."""
    from pipeline.models.head_names import eagle3_layers
    from pipeline.models.heads.draft import HeadDraft, MedusaDraft
    from pipeline.models.heads.eagle import EagleHead
    from pipeline.models.heads.eagle3 import Eagle3Head
    from pipeline.models.heads.medusa import MedusaHeads
    from pipeline.models.heads.msd import MsdHead
    from pipeline.models.heads.vispec import VispecHead
    from pipeline.models.hf import HFLlava
    from pipeline.models.tiny import build_llava, llava_processor
    from pipeline.models.tiny_heads import eagle3_config, eagle_config
    from tests.test_sampling import WORDS, word_tokenizer

    tokenizer = word_tokenizer()
    target = HFLlava(build_llava(tokenizer, seed=0), llava_processor(tokenizer), "word-target")
    torch.manual_seed(11)
    layers = {"eagle": EagleHead, "msd": MsdHead, "vispec": VispecHead}
    if kind in layers:
        module = layers[kind](eagle_config(target.model)).eval()
        return target, HeadDraft(module, target, f"{kind}:word", kind)
    head = Eagle3Head(eagle3_config(target.model, 9)).eval()
    with torch.no_grad():
        head.d2t.copy_(torch.tensor([0, 0, 0, 0, 2, 2, 2, 2, 2]))  # the words and one special: ids 0-3, 6-10
        head.t2d.copy_(torch.tensor([True] * 4 + [False] * 2 + [True] * 5))
    if kind == "medusa":
        return target, MedusaDraft(MedusaHeads(64, len(WORDS), 2, 1).eval(), target, "medusa:word", "medusa")
    head.target_layers = eagle3_layers(head.config.to_dict(), 2)
    return target, HeadDraft(head, target, "eagle3:word", "eagle3")


def first_token_distributions(target, head) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's and the head's next-token distributions after test_sampling's prompt."""
    from pipeline.decoding.inputs import tokenize
    from pipeline.decoding.engine import prefilled_rows
    from pipeline.models.base import LAST_HIDDEN
    from tests.test_sampling import SAMPLE

    prompt = tokenize(target, SAMPLE)
    rows, (_, states) = prefilled_rows(target, [prompt], "M", None, engine="eager", capacity=4, role="target",
                                       hidden=(LAST_HIDDEN,))
    head_rows, _ = prefilled_rows(head, [prompt], "M", None, engine="eager", capacity=4, role="draft",
                                  target_states=rows.prompt_states(states))
    last = torch.tensor([[prompt.ids[-1]]])
    p = torch.softmax(rows.feed(last)[0, -1], -1)
    q = torch.softmax(head_rows.feed(last, valid=[1], features=states[:, -1:])[0, -1], -1)
    return p, q


DYNAMIC, EAGLE2 = {"kind": "dynamic", "nodes": 4, "top_k": 2}, {"kind": "eagle2", "depth": 1, "top_k": 2, "total_tokens": 5}
# every head kind, and every verify kind alone and in a batch, at least once (not every product:
# each case decodes 800 requests)
SAMPLED = [("eagle", "chain", 1), ("eagle", EAGLE2, 4), ("eagle3", "chain", 4), ("eagle3", DYNAMIC, 4),
           ("msd", "chain", 1), ("vispec", "chain", 4), ("vispec", EAGLE2, 4), ("medusa", "chain", 1),
           ("medusa", DYNAMIC, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("kind,verify,batch", SAMPLED)
def test_sampling_with_a_head_keeps_the_targets_distribution(kind, verify, batch):
    from tests.test_sampling import RUNS, SAMPLE, TOLERANCE, exact_two_token_distribution, total_variation

    target, head = word_head(kind)
    p, q = first_token_distributions(target, head)
    assert 0.5 * float((p - q).abs().sum()) > 0.3  # the head alone is far off
    exact = exact_two_token_distribution(target)
    config = DecodeConfig("M", gamma=2, temperature=1.0, max_new_tokens=2, verify=make_verify(verify))
    counts: dict[tuple[int, ...], int] = {}
    for start in range(0, RUNS, batch):
        requests = [replace(SAMPLE, row=start + i) for i in range(batch)] if batch > 1 else [SAMPLE]
        for record in speculative_decode(target, head, requests, replace(config, seed=start if batch == 1 else 0)):
            counts[tuple(record.output_ids)] = counts.get(tuple(record.output_ids), 0) + 1
    assert total_variation({k: v / RUNS for k, v in counts.items()}, exact) < TOLERANCE


def test_gemma3_hidden_states_keep_its_sliding_window_masks(tiny_dirs):
    """What a head reads of a Gemma 3 target goes through the family's own forward: the prefill's
    states equal the language model's own (its sliding-window layers masked past 8 keys), and
    differ from a forward that skipped those masks."""
    from pipeline.decoding.engine import prefilled_rows
    from pipeline.decoding.inputs import tokenize
    from pipeline.models.base import LAST_HIDDEN
    from pipeline.models.hf import HFModel

    target = load_model(tiny_dirs["gemma3_target"])
    sample = Sample("unit", "test", 0, "first", "USER: " + "describe the red square in detail " * 3 + "ASSISTANT:", ())
    prompt = tokenize(target, sample)
    assert len(prompt.ids) > 2 * target.window
    rows, (_, states) = prefilled_rows(target, [prompt], "M", None, engine="eager", capacity=4, role="target",
                                       hidden=(LAST_HIDDEN,))
    embeds = target.embed_tokens(torch.tensor(prompt.ids[:-1]))[None]
    with torch.no_grad():
        own = target.model.model.language_model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1]
        causal = torch.zeros(1, 1, embeds.shape[1], embeds.shape[1]).masked_fill_(
            torch.ones(embeds.shape[1], embeds.shape[1], dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
        _, unmasked = HFModel._forward(target, DynamicCache(), 1, False, (LAST_HIDDEN,), inputs_embeds=embeds,
                                       attention_mask=causal, position_ids=torch.arange(embeds.shape[1])[None])
    torch.testing.assert_close(states, own, atol=1e-5, rtol=1e-5)
    assert (states - unmasked).abs().max() > 1e-3  # skipping the window would show


@pytest.mark.slow
def test_a_heads_compiled_steps_match_eager(tiny_dirs, monkeypatch):
    """fp32, the GPU's path (on a GPU the steps replayed as CUDA graphs, the head's features an
    input of the graph; on a CPU forced through torch.compile): the head's steps and the target's
    verify returning its states give eager's tokens and accepted counts, on a chain at batch 1 and a
    tree at batch 3, every step compiled (a head's model has no generation config to compile from)."""
    monkeypatch.setenv("TABED_COMPILE", "1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target = load_model(tiny_dirs["bigram_target"], device=device)
    head = load_head("eagle", tiny_dirs["eagle_head"], target)
    for verify, batch in (("chain", prompts(1)), ({"kind": "dynamic", "nodes": 8, "top_k": 3}, prompts(3))):
        config = DecodeConfig("M", gamma=3, max_new_tokens=MAX_NEW, verify=make_verify(verify))
        static = speculative_decode(target, head, batch, config, engine="static")
        eager = speculative_decode(target, head, batch, config, engine="eager")
        assert [(r.output_ids, r.accepted_per_block) for r in static] == \
            [(r.output_ids, r.accepted_per_block) for r in eager], verify
        want = "captured" if device == "cuda" else "compiled"
        assert all(r.steps == want for r in static), [(r.steps, r.fallback) for r in static]


@torch.no_grad()
def eagle2_reference(target, head, sample: Sample, depth: int, top_k: int, total_tokens: int) -> set[tuple]:
    """EAGLE-2's tree for the first block, written from the algorithm with no cache: the root's
    `top_k` children; `depth` times, each of the `top_k` best nodes of the newest level (by path
    log-probability) gets its `top_k` children; the tree is the best `total_tokens - 1` of every
    node so made. Each node as its path of tokens from the root."""
    ids = target.tokenize_prompt(sample.prompt)
    prompt = method_embeddings(target, "M", ids, sample.pixels())[:-1]  # the block starts at the last token
    lm_head = lambda states: head.model.next_logits(states, target.model.get_output_embeddings())
    features = target_states(target, head, prompt)
    sequence = torch.cat([prompt, target.embed_tokens(torch.tensor(ids[-1:]))])
    visual = image_rows(target, ids, sample.pixels())
    context, positions, summary = reference_rows(head, sequence[1:], features, visual[1:])

    def after(rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's features and log-probabilities after the last of `rows`."""
        state = head_states(head, rows, positions)[-1]
        return state, torch.log_softmax(lm_head(state).double(), -1)

    state, logp = after(context, positions)
    top = logp.topk(top_k)
    # a node: (score, path, rows the head read to reach it and their positions, its state)
    level = [(float(s), (int(t),), (context, positions), state) for s, t in zip(top.values, top.indices)]
    candidates = list(level)
    for _ in range(depth):
        children = []
        for score, path, (rows, positions), state in sorted(level, key=lambda node: -node[0])[:top_k]:
            token = target.embed_tokens(torch.tensor(path[-1:]))
            rows = torch.cat([rows, head.model.fuse(token, state[None], summary)])
            positions = torch.cat([positions, positions[-1:] + 1])
            child_state, logp = after(rows, positions)
            top = logp.topk(top_k)
            children += [(score + float(s), path + (int(t),), (rows, positions), child_state)
                         for s, t in zip(top.values, top.indices)]
        candidates += children
        level = children
    best = sorted(candidates, key=lambda node: (-node[0], len(node[1])))[: total_tokens - 1]
    return {path for _, path, _, _ in best}


def test_the_eagle2_tree_is_eagles(bigram_eagle):
    """fp64: the first block's tree (every node as its path from the root) is the uncached
    reference's, at MMSpec's setting and a small one."""
    from pipeline.decoding.draft_eagle2 import Eagle2TreeProposer
    from pipeline.decoding.engine import prefilled_rows
    from pipeline.decoding.inputs import tokenize
    from pipeline.decoding.proposals import Pending

    target, head = bigram_eagle
    for model in (target, head):
        model.model.double()
        model.dtype = torch.float64
    try:
        for sample in prompts(2):
            for depth, top_k, total in ((3, 8, 30), (2, 3, 6)):
                config = DecodeConfig("M", gamma=depth + 1, max_new_tokens=MAX_NEW,
                                      verify=make_verify({"kind": "eagle2", "depth": depth, "top_k": top_k,
                                                          "total_tokens": total}))
                prompt = tokenize(target, sample)
                rows, (_, states) = prefilled_rows(target, [prompt], "M", None, engine="eager", capacity=64,
                                                   role="target", hidden=head.target_layers)
                head_rows, _ = prefilled_rows(head, [prompt], "M", None, engine="eager", capacity=64,
                                              role="draft", target_states=rows.prompt_states(states))
                proposer = Eagle2TreeProposer(config)
                proposer.start(head_rows)
                first = Pending(torch.tensor([[prompt.ids[-1]]]), [1], states[:, -1:])
                tree = proposer.propose(first, torch.ones(1, 1, dtype=torch.float64), [MAX_NEW], None).tree
                tokens, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
                path = lambda i: () if i == 0 else path(parents[i - 1]) + (tokens[i - 1],)
                ours = {path(i) for i in range(1, len(tokens) + 1)}
                assert len(ours) == total - 1 and ours == eagle2_reference(target, head, sample, depth, top_k, total)
    finally:
        for model in (target, head):
            model.model.float()
            model.dtype = torch.float32


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["static", "eager"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_head_kind_drafts_for_every_family(tiny_dirs, family, engine):
    """Each chat family made a bigram target (Qwen2.5-VL and Qwen3-VL: M-RoPE; InternVL3; Gemma 3:
    sliding windows) with a tiny head of every kind in its published layout, loaded from its
    files: greedy SD is the target's own greedy output for every verify kind at batch 3 and 1,
    and every head accepts (tau above 1.5 on a chain)."""
    from tests.test_batch_decoding import samples

    target = load_model(tiny_dirs[f"{family}_bigram_target"])
    batch = samples(3)
    reference = [r.output_ids for r in autoregressive_decode(target, batch, max_new_tokens=MAX_NEW, engine=engine)]
    for kind in KINDS:
        head = load_head(kind, tiny_dirs[f"{family}_{kind}_head"], target)
        for verify in VERIFY:
            spec = make_verify(verify)
            config = DecodeConfig("M", gamma=spec.settled(1, 4)[1], max_new_tokens=MAX_NEW,
                                  verify=spec.settled(1, 4)[0])
            together = speculative_decode(target, head, batch, config, engine=engine)
            alone = speculative_decode(target, head, batch[:1], config, engine=engine)
            assert [r.output_ids for r in together] == reference, (kind, verify)
            assert alone[0].output_ids == reference[0], (kind, verify)
            if verify == "chain":
                assert sum(r.tau for r in together) / len(together) > 1.5, kind


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_an_m_rope_head_rotates_by_its_targets_positions(tiny_dirs, family):
    """An EAGLE-3 head whose config names M-RoPE sections as SpecForge writes them (Qwen2.5-VL's
    blocks, Qwen3-VL's interleaving): each of its rows takes its token's three coordinates in the
    target's prompt, so the decoder's first proposal is an uncached forward's at those positions,
    and not the one at plain indices."""
    from pipeline.decoding.engine import prefilled_rows
    from pipeline.decoding.inputs import tokenize
    from tests.test_batch_decoding import samples

    target = load_model(tiny_dirs[f"{family}_bigram_target"])
    head = load_head("eagle3", tiny_dirs[f"{family}_eagle3_head"], target)
    assert head.target_positions
    torch.manual_seed(0)
    with torch.no_grad():  # attention spread past the token itself, so where a row sits matters
        for projection in (head.model.midlayer.self_attn.q_proj, head.model.midlayer.self_attn.k_proj):
            projection.weight.add_(torch.randn_like(projection.weight))
    sample = samples(1)[0]
    prompt = tokenize(target, sample)
    rows, (_, states) = prefilled_rows(target, [prompt], "M", None, engine="eager", capacity=4, role="target",
                                       hidden=head.target_layers)
    head_rows, _ = prefilled_rows(head, [prompt], "M", None, engine="eager", capacity=4, role="draft",
                                  target_states=rows.prompt_states(states))
    ours = head_rows.feed(torch.tensor([[prompt.ids[-1]]]), valid=[1], features=states[:, -1:])[0, -1]
    with torch.no_grad():
        spliced = method_embeddings(target, "M", prompt.ids, sample.pixels())
        read = head.fuse_prompt(spliced[1:], rows.prompt_states(states)[0]).rows
        logits = lambda positions: head.model.next_logits(head_states(head, read, positions)[-1],
                                                          target.model.get_output_embeddings())
        positions = target.prompt_positions(spliced)[:, 1:]
        assert bool((positions[1:] != positions[0]).any())  # an image's rows: the axes differ
        torch.testing.assert_close(ours, logits(positions), atol=1e-4, rtol=1e-4)
        moved = (ours - logits(torch.arange(len(read)))).abs().max()
        # the tiny Qwen2.5-VL head's first proposal barely moves with positions (4e-6 measured, though
        # its rotary tables do); Qwen3-VL's shows plain indices would be caught
        assert moved > 1e-3 or family == "qwen2_5_vl", moved
