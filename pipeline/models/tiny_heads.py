"""Tiny head drafts for tests and the smoke grid, written in their kinds' published layouts and
loaded by the same code as a hub checkpoint (`pipeline.models.heads`).

They draft for the bigram target (`pipeline.models.tiny_ssm`): its greedy next token is a fixed
permutation of its last token, and its last hidden state is the normed embedding of the token,
so a head whose `fc` passes the token's embedding through predicts it exactly. Seeded noise on
`fc`, a small weight on the features before the token and a scaled attention output make the
head disagree with it now and then, depending on the features and the context (tau about 2 at
gamma 5), so blocks accept none, some or all of their proposals, and a head handed the wrong
features or context would accept differently.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast

from pipeline.models.heads.eagle import EagleHead
from pipeline.models.heads.eagle3 import Eagle3Head
from pipeline.models.heads.medusa import MedusaHeads
from pipeline.models.heads.vispec import VispecHead

# fc's noise on the token, its weight on the features before it, the attention output's scale
EAGLE_NOISE, EAGLE_FEATURES, EAGLE_ATTENTION = 1.5, 0.6, 6.0
# Medusa's: the noise of its residual blocks, which grows with the head (later tokens are harder)
MEDUSA_HEADS, MEDUSA_NOISE = 4, 1.0
# ViSpec's: its learned queries, and img_fc's weight on the image summary
VISPEC_QUERIES, VISPEC_SUMMARY = 2, 0.1
# EAGLE-3's: fc's weight on the three states, how sharply attention looks at the token, how strongly
# the layer passes it on (above the state before it, which its residual carries), the MLP's scale
EAGLE3_FEATURES, EAGLE3_FOCUS, EAGLE3_PASS, EAGLE3_MLP = 2.5, 3.0, 2.0, 0.1


def embedding_scale(target: PreTrainedModel) -> float:
    """What the target multiplies its token embeddings by (Gemma's square root of its width; 1
    for others), so a tiny head weighs a token and its features alike in every family."""
    return float(getattr(target.get_input_embeddings(), "embed_scale", 1.0))


def eagle_config(target: PreTrainedModel) -> LlamaConfig:
    """The head's config as EAGLE writes it: the target's text config, one decoder layer."""
    text = target.config.get_text_config()
    return LlamaConfig(
        vocab_size=text.vocab_size, hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
        num_hidden_layers=1, num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads, max_position_embeddings=text.max_position_embeddings,
        rms_norm_eps=text.rms_norm_eps, bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id, tie_word_embeddings=False, bias=True,
    )


@torch.no_grad()
def build_eagle_head(target: PreTrainedModel, out_dir: Path, seed: int = 5) -> Path:
    """An EAGLE-1/2 head for the bigram `target`, written to `out_dir` in EAGLE's layout (MSD's
    too: the same files; MSD reads a prompt's image rows apart)."""
    head, config = eagle_head(target, seed)
    return save_head(head, config.to_dict(), out_dir)


def eagle_head(target: PreTrainedModel, seed: int) -> tuple[EagleHead, LlamaConfig]:
    """The EAGLE-1/2 head `build_eagle_head` writes, and its config."""
    torch.manual_seed(seed)
    config = eagle_config(target)
    head = EagleHead(config).eval()
    hidden = config.hidden_size
    noise = lambda scale: scale * torch.randn(hidden, hidden) / hidden ** 0.5
    token = (torch.eye(hidden) + noise(EAGLE_NOISE)) / embedding_scale(target)
    head.fc.weight.copy_(torch.cat([token, noise(EAGLE_FEATURES)], 1))
    head.fc.bias.zero_()
    layer = head.layers[0]
    layer.self_attn.o_proj.weight.mul_(EAGLE_ATTENTION)
    layer.mlp.down_proj.weight.mul_(0.1)
    return head, config


@torch.no_grad()
def build_vispec_head(target: PreTrainedModel, out_dir: Path, seed: int = 11) -> Path:
    """A ViSpec head for the bigram `target`, in ViSpec's layout: the target's own config with one
    layer (and Qwen's `qkv_bias`), EAGLE's weights as `build_eagle_head` makes them, and the image
    adaptor and `img_fc` drawn at random, `img_fc`'s weight on the image summary large enough that
    a head handed another summary, or attending to the image rows it drops, accepts differently."""
    eagle, _ = eagle_head(target, seed)
    text = target.config.get_text_config()
    qkv_bias = "qwen2" in text.model_type  # ViSpec's Qwen2.5-VL heads have q/k/v biases, as Qwen2's layers do
    config = eagle_config(target)
    config.update({"architectures": target.config.architectures, "qkv_bias": qkv_bias,
                   "num_q": VISPEC_QUERIES})
    head = VispecHead(config).eval()
    head.load_state_dict(eagle.state_dict(), strict=False)
    hidden = config.hidden_size
    noise = lambda *shape: torch.randn(*shape) / shape[-1] ** 0.5
    for projection in (head.imadpt.k_proj, head.imadpt.v_proj, head.imadpt.o_proj):
        projection.weight.copy_(noise(*projection.weight.shape))
        if projection.bias is not None:
            projection.bias.copy_(0.1 * torch.randn_like(projection.bias))
    head.img_fc.weight.copy_(torch.cat([torch.eye(hidden), VISPEC_SUMMARY * noise(hidden, hidden)], 1))
    attention = head.layers[0].self_attn
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        if projection.bias is not None:
            projection.bias.copy_(0.1 * torch.randn_like(projection.bias))
    written = {**config.to_dict(), "model_type": target.config.model_type}
    written.pop("num_q")  # ViSpec's config does not name it: `imadpt.q` does
    return save_head(head, written, out_dir)


def save_head(head: torch.nn.Module, config: dict, out_dir: Path) -> Path:
    """`config.json` (`config`, as the kind's code writes it) and `model.safetensors`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: tensor.contiguous() for name, tensor in head.state_dict().items()},
              out_dir / "model.safetensors")
    return out_dir


def eagle3_config(target: PreTrainedModel, drafted: int) -> LlamaConfig:
    """EAGLE-3's config as its code writes it: one layer, the draft vocabulary's size, and the
    target layers it reads named (EAGLE's default, 2, L // 2 and L - 3, needs six layers)."""
    config = eagle_config(target)
    config.architectures = ["LlamaForCausalLMEagle3"]
    config.draft_vocab_size = drafted
    config.eagle_aux_hidden_state_layer_ids = [0, 1, 2]
    config.bias = False
    rope = target.config.get_text_config().rope_parameters or {}
    if "mrope_section" in rope:  # an M-RoPE target: its head rotates by its positions, as SpecForge's do
        config.rope_parameters = {**rope, "rope_type": "default"}
    return config


def spec_forge_rope(config: dict) -> dict:
    """An EAGLE-3 config's M-RoPE keys as SpecForge writes them: `rope_scaling` of type `mrope`
    (Qwen2.5-VL's sections) or `default` with `mrope_interleaved` (Qwen3-VL's), beside `rope_theta`."""
    rope = config.pop("rope_parameters")
    scaling = {"mrope_section": rope["mrope_section"]}
    if rope.get("mrope_interleaved"):
        scaling = {"rope_type": "default", **scaling, "mrope_interleaved": True}
    else:
        scaling = {"type": "mrope", **scaling}
    return {**config, "rope_scaling": scaling, "rope_theta": rope["rope_theta"]}


@torch.no_grad()
def build_eagle3_head(target: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out_dir: Path,
                      seed: int = 6) -> Path:
    """An EAGLE-3 head for the bigram `target`, written to `out_dir` in EAGLE's layout. Its draft
    vocabulary is the target's ordinary tokens (`d2t`, `t2d` map it back). Each attention head
    looks at the token itself (its query and key are the same slice of the token's normed
    embedding, so only the token's own key matches it), and the layer passes that slice on; the
    LM head's row of a token is the slice of the embedding of the token it follows. The three
    states before the token, through `fc`, and the MLP add the noise."""
    torch.manual_seed(seed)
    specials = set(tokenizer.all_special_ids)
    words = torch.tensor([i for i in range(len(tokenizer)) if i not in specials])
    config = eagle3_config(target, len(words))
    head = Eagle3Head(config).eval()
    hidden, heads, groups = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    width, per_group = hidden // heads, heads // groups
    scale = EAGLE3_FEATURES / embedding_scale(target)  # the target's states are its embeddings' scale
    head.fc.weight.copy_(scale * torch.randn_like(head.fc.weight) / head.fc.weight.shape[1] ** 0.5)
    attention = head.midlayer.self_attn
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj):
        projection.weight.zero_()
    for group in range(groups):  # query heads of group g, its key and value head: slice g of the embedding
        part = slice(group * width, (group + 1) * width)
        attention.k_proj.weight[part, part] = EAGLE3_FOCUS * torch.eye(width)
        attention.v_proj.weight[part, part] = torch.eye(width)
        for j in range(per_group):
            query = (group * per_group + j) * width
            attention.q_proj.weight[query : query + width, part] = EAGLE3_FOCUS * torch.eye(width)
        first = group * per_group * width
        attention.o_proj.weight[part, first : first + width] = EAGLE3_PASS * torch.eye(width)  # first head
    head.midlayer.mlp.down_proj.weight.mul_(EAGLE3_MLP)
    passed = groups * width  # the embedding's first dimensions, which the layer passes on
    head.lm_head.weight.zero_()
    head.lm_head.weight[:, :passed] = target.lm_head.weight[words, :passed]
    head.d2t.copy_(words - torch.arange(len(words)))
    head.t2d.zero_()[words] = True
    written = config.to_dict()
    return save_head(head, spec_forge_rope(written) if head.target_positions else written, out_dir)


@torch.no_grad()
def build_medusa_head(target: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out_dir: Path,
                      seed: int = 9) -> Path:
    """Medusa heads for the bigram `target`, in Medusa's files (`config.json`, `medusa_lm_head.pt`).
    Head k must name the token k + 2 places on: its projection's row of the token that follows
    token w k + 2 times is w's normed embedding, so the target's state at w (its normed
    embedding) picks it; seeded noise in its one residual block, growing with k, errs now and then."""
    torch.manual_seed(seed)
    text = target.config.get_text_config()
    heads = MedusaHeads(text.hidden_size, text.vocab_size, MEDUSA_HEADS, 1).eval()
    specials = set(tokenizer.all_special_ids)
    words = torch.tensor([i for i in range(len(tokenizer)) if i not in specials])
    normed = target.lm_head.weight  # its row of follows(w) is w's normed embedding
    follows = torch.arange(text.vocab_size)
    embeddings = target.model.language_model.embed_tokens.weight[words].float()
    follows[words] = (embeddings @ normed.float().T).argmax(-1)
    after = follows.clone()  # w -> the token after the token after w
    after[words] = follows[follows[words]]
    for k, head in enumerate(heads):
        block, projection = head[0], head[1]
        block.linear.weight.copy_(MEDUSA_NOISE * (k + 1) * torch.randn_like(block.linear.weight)
                                  / text.hidden_size ** 0.5)
        block.linear.bias.zero_()
        projection.weight.zero_()
        projection.weight[after[words]] = normed[follows[words]]
        after[words] = follows[after[words]]
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": MEDUSA_HEADS, "medusa_num_layers": 1,
              "base_model_name_or_path": "tiny:bigram_target"}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    torch.save({name: tensor.contiguous() for name, tensor in heads.state_dict().items()},
               out_dir / "medusa_lm_head.pt")
    return out_dir


def build_family_heads(out: Path, family: str) -> None:
    """A chat family's tiny model made a bigram target (`make_bigram_target`; Qwen2.5-VL and
    Qwen3-VL are M-RoPE targets, Gemma 3 one with sliding-window layers) and a head of every
    kind for it, under `out` as `<family>_bigram_target` and `<family>_<kind>_head`."""
    from pipeline.models.tiny_families import CHAT_FAMILY_BUILDERS
    from pipeline.models.tiny_ssm import make_bigram_target

    tokenizer_of, build, processor_of = CHAT_FAMILY_BUILDERS[family]
    tokenizer = tokenizer_of()
    target = make_bigram_target(build(tokenizer, seed=4), tokenizer)
    target.save_pretrained(out / f"{family}_bigram_target")
    processor_of(tokenizer, target).save_pretrained(out / f"{family}_bigram_target")
    head = lambda kind: out / f"{family}_{kind}_head"
    build_eagle_head(target, head("eagle"), seed=13)
    build_eagle3_head(target, tokenizer, head("eagle3"), seed=10)
    build_eagle_head(target, head("msd"), seed=14)
    build_vispec_head(target, head("vispec"), seed=12)
    build_medusa_head(target, tokenizer, head("medusa"), seed=15)
