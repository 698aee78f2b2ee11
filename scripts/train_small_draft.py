"""Train the embedded pair's small draft (seeded, CPU, ~45 minutes on 2 cores), or its
state-space sibling.

    python scripts/train_small_draft.py [--out pipeline/assets/embedded/small_draft]
    python scripts/train_small_draft.py --arch mamba2 [--teacher-cache FILE]   # embedded:ssm_draft

Distillation from the embedded target, as the paper's small drafts learn from their target's
outputs (shape: pipeline/models/embedded_parts/small_draft.py):
1. prompts on easy-VQA TRAIN images in the forms of the benchmark scenarios (describe, VQA
   with the reasoning instruction, compare two images), plus second turns built on them as
   the grid builds them: `qaorg` (the next training prompt) and `gsm8k` (questions from the
   second half of the shipped GSM8K-like list). Held out: the test images every embedded
   scenario uses, the first half of that list, and the story scenario, which stays out of
   distribution as the paper's OOD datasets are;
2. teacher: the target's greedy answers (at most `--answer-tokens`, with their end token),
   from its own M prompt embeddings;
3. student: embeddings initialised from a PCA of the target's, its projector's input
   standardisation copied from the target's projector; cross-entropy on the teacher's tokens,
   each row drafted as M (full image tokens), P (2x2-pooled), T (images as newlines) or C
   (the embedded captioner's captions), so one draft serves all four methods;
4. its output vocabulary: the tokens of the teacher's answers and SmolLM2's 8192 first ids
   (embedded_parts/small_draft says why);
5. the fp16-rounded weights (what ships) are loaded back through `load_embedded` and scored on
   held-out test samples: tau of M, T, C and P by trace replay (the first `--held-out` samples
   of embedded_describe, embedded_vqa and embedded_compare) and Tq/Tp by `calibrate`;
   metrics.json records these, the losses and the times.

`--rescore --teacher-cache FILE` redoes steps 4-5 for the weights already in `--out`.
"""
from __future__ import annotations

import argparse
import json
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
from pipeline.data.prompts import (  # noqa: E402
    REASONING_INSTRUCTION, continue_conversation, image_question, user_turn,
)
from pipeline.data.turns import QUESTION_SETS, load_questions  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.replay import replay
from pipeline.decoding.step_costs import calibrate  # noqa: E402
from pipeline.decoding.traces import collect_traces  # noqa: E402
from pipeline.drafting.methods import method_embeddings, splice  # noqa: E402
from pipeline.models.embedded import (  # noqa: E402
    SMALL_DRAFT_DIR, SSM_DRAFT_DIR, EmbeddedLVLM, EmbeddedSSM, load_embedded, load_embedded_captioner,
)
from pipeline.models.embedded_parts.projector import Projector  # noqa: E402
from pipeline.models.embedded_parts.small_draft import (  # noqa: E402
    ARCHITECTURES, load_small_draft, output_vocabulary, save_small_draft, save_vocabulary,
)

METHOD_SHARES = {"M": 0.45, "P": 0.15, "T": 0.25, "C": 0.15}
HELD_OUT_DATASETS = ("embedded_describe", "embedded_vqa", "embedded_compare")
# where it goes, its adapter, its name
SHIPPED = {"llama": (SMALL_DRAFT_DIR, EmbeddedLVLM, "embedded:small_draft"),
           "mamba2": (SSM_DRAFT_DIR, EmbeddedSSM, "embedded:ssm_draft")}
Example = tuple[str, tuple[str, ...], list[int]]  # (prompt, image paths, teacher answer ids)


def log(message: str, start: float) -> None:
    print(f"[{time.perf_counter() - start:7.1f}s] {message}", flush=True)


def first_turn_prompts(images: int, rng: random.Random) -> list[tuple[str, tuple[str, ...]]]:
    """Describe and VQA prompts on each of `images` random train images, compare prompts on
    consecutive pairs of every other two of them."""
    import easy_vqa

    paths = sorted(easy_vqa.get_train_image_paths().items())
    questions: dict[int, list[str]] = {}
    for question, _answer, image_id in zip(*easy_vqa.get_train_questions()):
        questions.setdefault(image_id, []).append(question)
    chosen = rng.sample(paths, images)
    prompts = []
    for k, (image_id, path) in enumerate(chosen):
        prompts.append((user_turn(DESCRIBE_PROMPTS[k % len(DESCRIBE_PROMPTS)]), (path,)))
        prompts.append((image_question(rng.choice(questions[image_id]), REASONING_INSTRUCTION), (path,)))
    for k in range(0, len(chosen) - 1, 4):
        prompts.append((user_turn(COMPARE_PROMPTS[(k // 4) % len(COMPARE_PROMPTS)]),
                        (chosen[k][1], chosen[k + 1][1])))
    return prompts


def second_turn_prompts(first: list[Example], count: int, tokenizer,
                        rng: random.Random) -> list[tuple[str, tuple[str, ...]]]:
    """`count` second turns on random first-turn examples, half qaorg and half gsm8k."""
    gsm8k = load_questions("gsm8k", 10_000, embedded=True)
    train_questions = gsm8k[len(gsm8k) // 2:]
    prompts = []
    for k, index in enumerate(rng.sample(range(len(first)), count)):
        prompt, images, answer = first[index]
        text = tokenizer.decode(answer, skip_special_tokens=True)
        if k % 2 == 0:
            following_prompt, following_images = first[(index + 1) % len(first)][:2]
            prompts.append((continue_conversation(prompt, text, following_prompt), images + following_images))
        else:
            question = user_turn(QUESTION_SETS["gsm8k"].to_text(rng.choice(train_questions)))
            prompts.append((continue_conversation(prompt, text, question), images))
    return prompts


class ImageCache:
    """Each training image opened, captioned and encoded once."""

    def __init__(self, model: EmbeddedLVLM, captioner) -> None:
        self.model, self.captioner = model, captioner
        self.images: dict[str, Image.Image] = {}
        self.grids: dict[str, torch.Tensor] = {}
        self.captions: dict[str, str] = {}

    def image(self, path: str) -> Image.Image:
        if path not in self.images:
            self.images[path] = Image.open(path).convert("RGB")
        return self.images[path]

    def grid(self, path: str) -> torch.Tensor:
        if path not in self.grids:
            self.grids[path] = self.model.vision.grid([self.image(path)])[0]
        return self.grids[path]

    def caption(self, path: str) -> str:
        if path not in self.captions:
            self.captions[path] = self.captioner.caption(self.image(path))
        return self.captions[path]


@torch.inference_mode()
def teacher_answers(target: EmbeddedLVLM, prompts: list, cache: ImageCache, max_new_tokens: int,
                    batch: int = 16) -> list[Example]:
    """The target's greedy answers (batched `generate` on its M embeddings, left-padded as the
    engine pads), cut after the first end token."""
    eos = sorted(target.eos_token_ids)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i][0]))  # similar lengths, little padding
    answers: dict[int, list[int]] = {}
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        embeds = [
            method_embeddings(target, "M", target.tokenize_prompt(prompts[i][0]),
                              [cache.image(p) for p in prompts[i][1]])
            for i in chunk
        ]
        width = max(e.shape[0] for e in embeds)
        padded = torch.zeros(len(embeds), width, embeds[0].shape[1])
        mask = torch.zeros(len(embeds), width, dtype=torch.long)
        for row, e in enumerate(embeds):
            padded[row, width - e.shape[0]:], mask[row, width - e.shape[0]:] = e, 1
        out = target.model.generate(inputs_embeds=padded, attention_mask=mask, max_new_tokens=max_new_tokens,
                                    do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
        for i, ids in zip(chunk, out.tolist()):
            answers[i] = ids[: next((j + 1 for j, t in enumerate(ids) if t in eos), len(ids))]
    return [(text, images, answers[i]) for i, (text, images) in enumerate(prompts)]


def new_student(target: EmbeddedLVLM, arch: str) -> EmbeddedLVLM:
    """The untrained draft of `arch`: the target's embedding geometry in fewer dimensions, and a
    projector that standardises features as the target's does and emits vectors of the
    draft's norm."""
    make_config, model_class = ARCHITECTURES[arch]
    config = make_config(target.model.config)
    lm = model_class(config)
    with torch.no_grad():
        embeddings = target.model.get_input_embeddings().weight.float()
        centred = embeddings - embeddings.mean(0)
        _, _, basis = torch.pca_lowrank(centred, q=config.hidden_size, center=False)
        reduced = centred @ basis
        lm.get_input_embeddings().weight.copy_(reduced / reduced.std() * 0.1)
    projector = Projector(hidden_dim=config.hidden_size)
    standardise = {k: v for k, v in target.projector.state_dict().items() if k.startswith("feature_")}
    projector.load_state_dict(standardise, strict=False)
    with torch.no_grad():
        projector.output_norm.fill_(float(lm.get_input_embeddings().weight.norm(dim=-1).mean()))
    return EmbeddedLVLM(lm, target.tokenizer, target.vision, projector, SHIPPED[arch][2])


def prompt_embeddings(draft: EmbeddedLVLM, method: str, text: str, paths: tuple[str, ...],
                      cache: ImageCache) -> torch.Tensor:
    """One prompt as the engine drafts it with `method`, with gradients through the draft (the
    frozen vision features come from the cache)."""
    ids = draft.tokenize_prompt(text)
    if method in ("M", "P"):
        tokens = [draft.vision.tokens(cache.grid(p)[None], pooled=method == "P")[0] for p in paths]
        return splice(draft, ids, [draft.projector(t) for t in tokens])
    captions = [cache.caption(p) for p in paths] if method == "C" else None
    return method_embeddings(draft, method, ids, [cache.image(p) for p in paths], captions)


def batch_loss(draft: EmbeddedLVLM, batch: list[Example], methods: list[str],
               cache: ImageCache) -> torch.Tensor:
    """Cross-entropy of the teacher's tokens, right-padded rows in one forward; logits only at
    the answer positions (the LM head over 49152 tokens is most of the cost)."""
    rows, positions, targets = [], [], []
    for b, ((text, paths, answer), method) in enumerate(zip(batch, methods)):
        prompt = prompt_embeddings(draft, method, text, paths, cache)
        rows.append(torch.cat([prompt, draft.embed_tokens(torch.tensor(answer))]))
        positions += [(b, prompt.shape[0] - 1 + j) for j in range(len(answer))]
        targets += answer
    width = max(r.shape[0] for r in rows)
    embeds = torch.zeros(len(rows), width, rows[0].shape[1])
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        embeds[b, : row.shape[0]] = row
        mask[b, : row.shape[0]] = 1
    # right padding: causal
    hidden = draft.model.base_model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    index = torch.tensor(positions)
    logits = draft.model.lm_head(hidden[index[:, 0], index[:, 1]])
    return F.cross_entropy(logits, torch.tensor(targets))


def train(draft: EmbeddedLVLM, data: list[Example], cache: ImageCache, steps: int, batch: int, lr: float,
          rng: random.Random, start: float) -> list[float]:
    params = list(draft.model.parameters()) + list(draft.projector.parameters())
    for p in params:
        p.requires_grad_(True)
    optimiser = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=lr, total_steps=steps, pct_start=0.1)
    letters, shares = list(METHOD_SHARES), list(METHOD_SHARES.values())
    draft.model.train()
    losses = []
    for step in range(steps):
        examples = rng.sample(data, batch)
        loss = batch_loss(draft, examples, rng.choices(letters, shares, k=batch), cache)
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % 100 == 0 or step == 0:
            log(f"step {step + 1}/{steps} loss {sum(losses[-100:]) / len(losses[-100:]):.3f}", start)
    return losses


def held_out_tau(target: EmbeddedLVLM, draft: EmbeddedLVLM, captioner, per_dataset: int,
                 max_new_tokens: int) -> dict:
    """Pooled tau per method on held-out test samples, by trace replay (pipeline.decoding.replay)."""
    samples = [s for name in HELD_OUT_DATASETS for s in load_samples(name, limit=per_dataset)]
    traces = [collect_traces(target, draft, s, "MTCP", captioner, max_new_tokens=max_new_tokens)
              for s in samples]
    tau = {}
    for method in "MTCP":
        records = [replay(t, DecodeConfig(methods=method, gamma=5, max_new_tokens=max_new_tokens))
                   for t in traces]
        accepted, blocks = sum(sum(r.accepted_per_block) for r in records), sum(r.blocks for r in records)
        tau[method] = round(1 + accepted / blocks, 3)
    return {"samples": [s.sample_id for s in samples], "tau": tau}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="llama",
                        help="llama: embedded:small_draft; mamba2: embedded:ssm_draft (default: %(default)s)")
    parser.add_argument("--out", type=Path,
                        help="where the weights go (default: the --arch's shipped folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=440,
                        help="easy-VQA train images for first-turn prompts")
    parser.add_argument("--second-turns", type=int, default=220)
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--held-out", type=int, default=5, help="test samples per scenario to score")
    parser.add_argument("--teacher-cache", type=Path,
                        help="JSON file to keep the teacher's answers in (and reuse)")
    parser.add_argument("--rescore", action="store_true",
                        help="keep the weights in --out: write their output vocabulary "
                             "(from --teacher-cache) and score them again")
    args = parser.parse_args()
    directory, adapter, name = SHIPPED[args.arch]
    args.out = args.out or directory
    if args.rescore and not (args.teacher_cache and args.teacher_cache.is_file()):
        parser.error("--rescore needs the --teacher-cache the weights were trained on")
    start = time.perf_counter()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)

    target = load_embedded("target")
    captioner = load_embedded_captioner()
    cache = ImageCache(target, captioner)
    if args.teacher_cache and args.teacher_cache.is_file():  # a rerun with other training settings
        saved = json.loads(args.teacher_cache.read_text())
        first, second = ([(t, tuple(i), a) for t, i, a in saved[k]] for k in ("first", "second"))
    else:
        first = teacher_answers(target, first_turn_prompts(args.images, rng), cache, args.answer_tokens)
        log(f"teacher: {len(first)} first-turn answers", start)
        second = teacher_answers(target,
                                 second_turn_prompts(first, args.second_turns, target.tokenizer, rng),
                                 cache, args.answer_tokens)
        if args.teacher_cache:
            args.teacher_cache.write_text(json.dumps({"first": first, "second": second}))
    data = first + second
    teacher_seconds = time.perf_counter() - start
    log(f"teacher: {len(second)} second-turn answers; {sum(len(a) for *_, a in data)} answer tokens", start)

    vocabulary = output_vocabulary(answer for *_, answer in data)
    if args.rescore:  # the shipped weights, with the output vocabulary of their own teacher answers
        save_vocabulary(vocabulary, args.out)
        metrics = json.loads((args.out / "metrics.json").read_text())
    else:
        draft = new_student(target, args.arch)
        losses = train(draft, data, cache, args.steps, args.batch, args.lr,
                       random.Random(args.seed + 1), start)
        train_seconds = time.perf_counter() - start - teacher_seconds
        save_small_draft(draft.model, draft.projector, args.out, vocabulary)
        (args.out / "__init__.py").touch()
        metrics = {
            "arch": args.arch, "seed": args.seed, "images": args.images, "first_turn_examples": len(first),
            "second_turn_examples": len(second), "answer_tokens": args.answer_tokens, "steps": args.steps,
            "batch": args.batch, "lr": args.lr, "method_shares": METHOD_SHARES,
            "loss_first_100": round(sum(losses[:100]) / 100, 4),
            "loss_last_100": round(sum(losses[-100:]) / 100, 4),
            "teacher_seconds": round(teacher_seconds, 1), "train_seconds": round(train_seconds, 1),
        }

    score_start = time.perf_counter()
    # scored with the node's two threads, as the grid's timed decodes and calibration run on a CPU
    # as written: fp16-rounded, as load_embedded reads it
    lm, projector = load_small_draft(args.out, torch.float32, args.arch)
    shipped = adapter(lm, target.tokenizer, target.vision, projector, name)
    scored = held_out_tau(target, shipped, captioner, args.held_out, args.answer_tokens)
    log(f"held-out tau: {scored['tau']}", start)
    ratios = calibrate(target, shipped, gammas=(5,), repeats=10, rounds=3)
    metrics.update({
        "parameters": sum(p.numel() for p in shipped.model.parameters()),
        "output_vocabulary": len(vocabulary),
        "held_out": scored,
        "tq_over_tp": round(ratios.ratio_draft_target, 4),
        "verify_ratio": round(ratios.ratio_verify, 4),
        "draft_rows_ratio": [round(r, 4) for r in ratios.draft_rows_ratio],
        "tp_ms": round(1e3 * ratios.target_token_s, 2), "tq_ms": round(1e3 * ratios.draft_token_s, 2),
        "threads": torch.get_num_threads(), "score_seconds": round(time.perf_counter() - score_start, 1),
    })
    if not args.rescore:
        metrics["total_seconds"] = round(time.perf_counter() - start, 1)
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log(f"wrote {args.out}: tau {scored['tau']}, Tq/Tp {metrics['tq_over_tp']}", start)


if __name__ == "__main__":
    main()
