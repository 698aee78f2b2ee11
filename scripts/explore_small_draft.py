"""Feasibility check for a small embedded draft: distil a narrow 2-layer draft from the embedded
target, then measure it against the real target. Seeded, CPU; prints name=value lines. Not
used by the pipeline: it measures whether such a draft is worth shipping.

    python scripts/explore_small_draft.py --images 300 --steps 1500     # ~25 min on 2 cores

1. teacher: the target's greedy answers (batched `generate` on its M embeddings) to describe,
   VQA-with-reasoning and compare prompts on easy-VQA TRAIN images (the default grid's test
   images stay held out);
2. student: a 2-layer Llama over the same tokenizer, embeddings initialised from a PCA of the
   target's, with its own projector on the same EfficientNet-Lite0 features; cross-entropy on
   the teacher's tokens, 70% of rows with M inputs and 30% with T;
3. tau of M, T and MT against the target with the engine's `speculative_decode` on the first
   five test samples of embedded_describe, embedded_vqa and embedded_compare, and Tq/Tp from
   `calibrate`.

Measured (2 cores, seed 0, a 128-wide 2-layer draft): 300 images (675 teacher answers),
1500 steps: tau(M) 2.83, tau(T) 2.77, tau(MT) 2.81 on held-out first turns, Tq/Tp 0.089;
120 images, 600 steps: tau(M) 2.32, Tq/Tp 0.085.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.data.embedded.scenarios import COMPARE_PROMPTS, DESCRIBE_PROMPTS  # noqa: E402
from pipeline.data.loading import load_samples  # noqa: E402
from pipeline.data.prompts import REASONING_INSTRUCTION, image_question, user_turn  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.live import speculative_decode  # noqa: E402
from pipeline.drafting.methods import method_embeddings, splice  # noqa: E402
from pipeline.models.embedded import EmbeddedLVLM, load_embedded  # noqa: E402
from pipeline.models.embedded_parts.projector import Projector  # noqa: E402
from pipeline.results.calibration import calibrate  # noqa: E402

MAX_NEW, BATCH, M_SHARE = 48, 8, 0.7


def training_prompts(images: int) -> list[tuple[str, list[Image.Image]]]:
    import easy_vqa

    paths = sorted(easy_vqa.get_train_image_paths().items())[:images]
    questions: dict[int, str] = {}
    for question, _answer, image_id in zip(*easy_vqa.get_train_questions()):
        questions.setdefault(image_id, question)
    prompts = []
    for k, (image_id, path) in enumerate(paths):
        image = Image.open(path).convert("RGB")
        prompts.append((user_turn(DESCRIBE_PROMPTS[k % len(DESCRIBE_PROMPTS)]), [image]))
        prompts.append((image_question(questions[image_id], REASONING_INSTRUCTION), [image]))
    for k in range(0, len(paths) - 1, 4):
        pair = [Image.open(paths[k + j][1]).convert("RGB") for j in (0, 1)]
        prompts.append((user_turn(COMPARE_PROMPTS[(k // 4) % len(COMPARE_PROMPTS)]), pair))
    return prompts


@torch.inference_mode()
def teacher_answers(target: EmbeddedLVLM, prompts: list) -> list[tuple[str, list, list[int]]]:
    """(prompt, images, the target's greedy answer ids up to and with its end token)."""
    eos = sorted(target.eos_token_ids)
    data = []
    for start in range(0, len(prompts), 16):
        batch = prompts[start:start + 16]
        embeds = [method_embeddings(target, "M", target.tokenize_prompt(text), images) for text, images in batch]
        width = max(e.shape[0] for e in embeds)
        padded = torch.zeros(len(embeds), width, embeds[0].shape[1])
        mask = torch.zeros(len(embeds), width, dtype=torch.long)
        for row, e in enumerate(embeds):  # left padding, as the engine pads
            padded[row, width - e.shape[0]:], mask[row, width - e.shape[0]:] = e, 1
        out = target.model.generate(inputs_embeds=padded, attention_mask=mask, max_new_tokens=MAX_NEW,
                                    do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
        for (text, images), ids in zip(batch, out.tolist()):
            end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            data.append((text, images, ids[:end]))
    return data


def student_of(target: EmbeddedLVLM, hidden: int, layers: int) -> EmbeddedLVLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    lm = target.model
    config = LlamaConfig(vocab_size=lm.config.vocab_size, hidden_size=hidden, intermediate_size=3 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, max_position_embeddings=2048,
                         bos_token_id=lm.config.bos_token_id, eos_token_id=lm.config.eos_token_id)
    student = LlamaForCausalLM(config)
    with torch.no_grad():  # the target's embedding geometry, in fewer dimensions
        embeddings = lm.get_input_embeddings().weight.float()
        centred = embeddings - embeddings.mean(0)
        _, _, basis = torch.pca_lowrank(centred, q=hidden, center=False)
        reduced = centred @ basis
        student.get_input_embeddings().weight.copy_(reduced / reduced.std() * 0.1)
    projector = Projector(hidden_dim=hidden)
    standardise = {k: v for k, v in target.projector.state_dict().items() if k.startswith("feature_")}
    projector.load_state_dict(standardise, strict=False)
    with torch.no_grad():
        projector.output_norm.fill_(float(student.get_input_embeddings().weight.norm(dim=-1).mean()))
    return EmbeddedLVLM(student, target.tokenizer, target.vision, projector, "embedded:small")


def train(draft: EmbeddedLVLM, data: list, steps: int) -> None:
    params = list(draft.model.parameters()) + list(draft.projector.parameters())
    optimiser = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    grids = {}  # frozen vision features per prompt
    draft.model.train()
    start = time.time()
    for step in range(steps):
        loss = 0.0
        for text, images, answer in random.sample(data, BATCH):
            ids = draft.tokenize_prompt(text)
            if random.random() < M_SHARE:
                key = (text, id(images[0]))
                grids.setdefault(key, draft.vision.tokens(draft.vision.grid(images)))
                prompt = splice(draft, ids, list(draft.projector(grids[key])))
            else:
                prompt = method_embeddings(draft, "T", ids, images)
            row = torch.cat([prompt, draft.model.get_input_embeddings()(torch.tensor(answer))])
            logits = draft.model(inputs_embeds=row[None]).logits[0, prompt.shape[0] - 1:prompt.shape[0] - 1 + len(answer)]
            loss = loss + F.cross_entropy(logits, torch.tensor(answer))
        loss = loss / BATCH
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step={step} loss={loss.item():.3f} seconds={time.time() - start:.0f}", flush=True)
    draft.model.eval()
    draft.projector.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="easy-VQA train images for teacher prompts")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--held-out", type=int, default=5, help="test samples per scenario to measure tau on")
    args = parser.parse_args()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    start = time.time()
    target = load_embedded("target")
    data = teacher_answers(target, training_prompts(args.images))
    print(f"teacher_examples={len(data)} teacher_seconds={time.time() - start:.0f}", flush=True)
    draft = student_of(target, args.hidden, args.layers)
    train(draft, data, args.steps)
    torch.set_num_threads(1)  # as the pipeline's CPU actors run
    held_out = [s for name in ("embedded_describe", "embedded_vqa", "embedded_compare") for s in load_samples(name, limit=args.held_out)]
    for methods in ("M", "T", "MT"):
        records = [speculative_decode(target, draft, s, DecodeConfig(methods=methods, gamma=5, max_new_tokens=64)) for s in held_out]
        accepted, blocks = sum(sum(r.accepted_per_block) for r in records), sum(r.blocks for r in records)
        print(f"tau_{methods}_held_out={1 + accepted / blocks:.2f}", flush=True)
    ratios = calibrate(target, draft, gamma=5, repeats=10, rounds=3)
    print(f"tq_over_tp={ratios.ratio_draft_target:.3f} verify_ratio={ratios.ratio_verify:.3f} total_seconds={time.time() - start:.0f}")


if __name__ == "__main__":
    main()
