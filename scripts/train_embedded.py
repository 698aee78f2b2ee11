"""Train the embedded pair's projector and captioner (seeded, CPU, ~20 minutes on 2 cores).

    python scripts/train_embedded.py [--out pipeline/assets/embedded] [--steps 600]

LLaVA stage-1 recipe with the language model (SmolLM2-135M-Instruct) and the vision encoder
(EfficientNet-Lite0) frozen:
1. label easy-vqa images with their colour and shape; extract EfficientNet features once;
2. captioner: linear colour and shape heads on globally pooled features;
3. long answers, LLaVA style: the frozen LM answers each open prompt given the caption as
   TEXT ("Image: a blue circle on a plain light background."), greedily;
4. projector: a cheap warm start (image tokens pointed at the colour and shape word
   embeddings, no LM), then trained so that, given the image tokens instead of the caption, the LM produces
   those answers (and "A blue circle." to short prompts); each step uses the full 49 or the
   2x2-pooled 16 tokens at random, so one projector serves drafting methods M and P;
5. evaluate on held-out test images: greedy answers to a short prompt must name the colour
   and the shape (full and pooled tokens), captioner accuracy; write weights + metrics.json.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.data.prompts import REASONING_INSTRUCTION  # noqa: E402
from pipeline.models.embedded import CAPTIONER_FILE, PROJECTOR_FILE  # noqa: E402
from pipeline.models.embedded_parts.captioner import ShapeHeads  # noqa: E402
from pipeline.models.embedded_parts.chat import to_chatml  # noqa: E402
from pipeline.models.embedded_parts.easyvqa import COLORS, SHAPES, LabelledImage, load_split  # noqa: E402
from pipeline.models.embedded_parts.language import IMAGE_TOKEN, load_language_model  # noqa: E402
from pipeline.models.embedded_parts.projector import Projector  # noqa: E402
from pipeline.models.embedded_parts.vision import VisionEncoder  # noqa: E402

# Open prompts whose long answers teach the target to write about the image at length.
OPEN_PROMPTS = (
    "Describe the image in detail.",
    "What do you see? Explain.",
    "Write a short story about this picture.",
    "What is in this picture?",
    "Explain what this image shows.",
)
TEACHER_HINT = " Answer with a detailed paragraph."  # seen by the teacher only
SHORT_PROMPTS = ("What is in the image? Answer briefly.", "Describe the image briefly.")
EVAL_PROMPT = SHORT_PROMPTS[0]
REASONING_PER_CLASS = 3
KIND_WEIGHTS = {"short": 0.3, "open": 0.45, "reasoning": 0.25}


def log(message: str, start: float) -> None:
    print(f"[{time.perf_counter() - start:7.1f}s] {message}", flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def open_images(items: list[LabelledImage]) -> list[Image.Image]:
    return [Image.open(item.path).convert("RGB") for item in items]


def extract_grids(vision: VisionEncoder, items: list[LabelledImage], batch: int = 32) -> torch.Tensor:
    """EfficientNet feature maps `[n, 1280, 7, 7]`, computed once for all training."""
    return torch.cat([vision.grid(open_images(items[i:i + batch])) for i in range(0, len(items), batch)])


def class_index(item: LabelledImage) -> tuple[int, int]:
    return COLORS.index(item.color), SHAPES.index(item.shape)


def train_captioner(pooled: torch.Tensor, labels: torch.Tensor, steps: int = 300) -> ShapeHeads:
    """Two linear heads, full-batch AdamW on standardised pooled features."""
    heads = ShapeHeads()
    heads.feature_mean.copy_(pooled.mean(0))
    heads.feature_std.copy_(pooled.std(0).clamp_min(1e-3))
    optimizer = torch.optim.AdamW(heads.parameters(), lr=1e-2, weight_decay=1e-2)
    for _ in range(steps):
        color, shape = heads(pooled)
        loss = F.cross_entropy(color, labels[:, 0]) + F.cross_entropy(shape, labels[:, 1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval().requires_grad_(False)


def teacher_prompt(caption: str, prompt: str, hint: str) -> str:
    user = f"Image: {caption} on a plain light background.\n{prompt}{hint}"
    return to_chatml(f"USER: {user} ASSISTANT:")


@torch.inference_mode()
def teacher_answers(lm, tokenizer, prompts: list[str], max_new_tokens: int,
                    batch: int = 24) -> list[list[int]]:
    """Greedy answers of the frozen LM (ids, ending with <|im_end|> when it stopped in time)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.padding_side = "left"
    answers = []
    for i in range(0, len(prompts), batch):
        enc = tokenizer(prompts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        out = lm.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=eos,
                          eos_token_id=eos)
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            answers.append(row[: row.index(eos) + 1] if eos in row else row)
    return answers


def user_ids(tokenizer, prompt: str) -> tuple[list[int], list[int]]:
    """Prompt ids before and after the single image placeholder (ChatML, as the adapter builds)."""
    ids = tokenizer(to_chatml(f"USER: {IMAGE_TOKEN}\n{prompt} ASSISTANT:"),
                    add_special_tokens=False)["input_ids"]
    cut = ids.index(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
    return ids[:cut], ids[cut + 1:]


def build_examples(tokenizer, lm, train: list[LabelledImage], answer_tokens: int, start: float,
                   rng: random.Random):
    """Per kind: (prompt, class, answer ids). Teacher answers are per (class, prompt)."""
    classes = [(c, s) for c in range(len(COLORS)) for s in range(len(SHAPES))]
    caption = {k: f"a {COLORS[k[0]]} {SHAPES[k[1]]}" for k in classes}
    examples: dict[str, list[tuple[str, tuple[int, int], list[int]]]] = {
        "short": [], "open": [], "reasoning": []}
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for k in classes:
        for prompt in SHORT_PROMPTS:
            text = caption[k][0].upper() + caption[k][1:] + "."
            examples["short"].append((prompt, k, tokenizer.encode(text, add_special_tokens=False) + [eos]))
    jobs = [("open", p, k, teacher_prompt(caption[k], p, TEACHER_HINT))
            for p in OPEN_PROMPTS for k in classes]
    by_class = {k: sorted({q for item in train if class_index(item) == k for q in item.questions})
                for k in classes}
    for k in classes:
        for question in rng.sample(by_class[k], REASONING_PER_CLASS):
            prompt = f"{REASONING_INSTRUCTION}\n{question[0].upper()}{question[1:]}"
            jobs.append(("reasoning", prompt, k, teacher_prompt(caption[k], prompt, "")))
    log(f"teacher: {len(jobs)} long answers of <= {answer_tokens} tokens", start)
    answers = teacher_answers(lm, tokenizer, [job[3] for job in jobs], answer_tokens)
    for (kind, prompt, k, _), answer in zip(jobs, answers):
        examples[kind].append((prompt, k, answer))
    return examples


def batch_inputs(lm, projector, tokenizer, grids, images_by_class, batch_examples, pooled: bool,
                 rng: random.Random):
    """Right-padded inputs_embeds, attention mask, and (position, target) pairs for the loss."""
    embed = lm.get_input_embeddings()
    rows, targets, positions = [], [], []
    for b, (prompt, k, answer) in enumerate(batch_examples):
        before, after = user_ids(tokenizer, prompt)
        grid = grids[rng.choice(images_by_class[k])][None]
        tokens = grid if not pooled else F.avg_pool2d(grid, kernel_size=2, stride=2, ceil_mode=True)
        image = projector(tokens.flatten(2).transpose(1, 2))[0]
        text_after = torch.tensor(after + answer)
        row = torch.cat([embed(torch.tensor(before)).float(), image, embed(text_after).float()])
        first_answer = len(before) + image.shape[0] + len(after)
        for j, token in enumerate(answer):  # the token at first_answer + j is predicted one earlier
            positions.append((b, first_answer + j - 1))
            targets.append(token)
        rows.append(row)
    width = max(r.shape[0] for r in rows)
    embeds = torch.zeros(len(rows), width, rows[0].shape[-1])
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        embeds[b, : row.shape[0]] = row
        mask[b, : row.shape[0]] = 1
    return embeds, mask, torch.tensor(positions), torch.tensor(targets)


def word_embedding(lm, tokenizer, word: str) -> torch.Tensor:
    ids = tokenizer.encode(" " + word, add_special_tokens=False)
    return lm.get_input_embeddings().weight[ids].mean(0).detach()


def warm_start(projector: Projector, lm, tokenizer, grids, labels: torch.Tensor, steps: int) -> None:
    """A cheap first alignment without the LM: alternate image tokens point (by cosine) at
    the embedding of the colour word and of the shape word, full and pooled grids in turn.
    Training through the LM afterwards starts from tokens that already read like words."""
    colors = torch.stack([word_embedding(lm, tokenizer, c) for c in COLORS])
    shapes = torch.stack([word_embedding(lm, tokenizer, s) for s in SHAPES])
    optimizer = torch.optim.AdamW(projector.parameters(), lr=1e-3)
    for step in range(steps):
        idx = torch.randint(0, grids.shape[0], (64,))
        grid = (grids[idx] if step % 2 == 0
                else F.avg_pool2d(grids[idx], kernel_size=2, stride=2, ceil_mode=True))
        out = projector(grid.flatten(2).transpose(1, 2))
        even = (torch.arange(out.shape[1]) % 2 == 0)[None, :, None]
        target = torch.where(even, colors[labels[idx, 0]][:, None], shapes[labels[idx, 1]][:, None])
        loss = (1 - F.cosine_similarity(out, target, dim=-1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def train_projector(lm, tokenizer, grids, train, examples, steps: int, batch: int, lr: float, start: float,
                    rng, evaluate, eval_every: int, warm_steps: int):
    """Warm start, then AdamW with warmup + cosine through the frozen LM; `evaluate(projector)`
    runs every `eval_every` steps (the learning curve in metrics.json)."""
    projector = Projector()
    tokens = grids.flatten(2).transpose(1, 2).reshape(-1, grids.shape[1])
    projector.feature_mean.copy_(tokens.mean(0))
    projector.feature_std.copy_(tokens.std(0).clamp_min(1e-2))
    projector.output_norm.fill_(float(lm.get_input_embeddings().weight.norm(dim=-1).mean()))
    warm_start(projector, lm, tokenizer, grids, torch.tensor([class_index(item) for item in train]),
               warm_steps)
    log(f"warm start: {warm_steps} steps", start)
    lm_bf16 = copy.deepcopy(lm).to(torch.bfloat16)  # frozen: only the projector (fp32) gets gradients
    images_by_class: dict[tuple[int, int], list[int]] = {}
    for i, item in enumerate(train):
        images_by_class.setdefault(class_index(item), []).append(i)
    kinds, weights = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())
    optimizer = torch.optim.AdamW(projector.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))
    )
    running, curve = [], []
    for step in range(steps):
        # One kind and one token layout per step: rows of similar length, little padding.
        kind, pooled = rng.choices(kinds, weights)[0], rng.random() < 0.5
        chosen = [rng.choice(examples[kind]) for _ in range(batch)]
        embeds, mask, positions, targets = batch_inputs(
            lm_bf16, projector, tokenizer, grids, images_by_class, chosen, pooled, rng
        )
        hidden = lm_bf16.model(inputs_embeds=embeds.to(torch.bfloat16), attention_mask=mask).last_hidden_state
        logits = lm_bf16.lm_head(hidden[positions[:, 0], positions[:, 1]]).float()
        loss = F.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        running.append(loss.item())
        if (step + 1) % 25 == 0 or step == 0:
            log(f"step {step + 1}/{steps} loss {np.mean(running[-25:]):.3f}", start)
        if (step + 1) % eval_every == 0 and step + 1 < steps:
            projector.eval()
            accuracy = evaluate(projector)
            projector.train()
            curve.append({"step": step + 1, "accuracy_full": accuracy,
                          "seconds": round(time.perf_counter() - start, 1)})
            log(f"step {step + 1}: held-out short-prompt accuracy {accuracy:.3f}", start)
    return projector.eval().requires_grad_(False), running, curve


@torch.inference_mode()
def greedy_answers(lm, tokenizer, projector, grids, prompt: str, pooled: bool, max_new_tokens: int,
                   batch: int = 50):
    """Greedy fp32 answers of the target to `prompt` for each image (left-padded batches)."""
    embed = lm.get_input_embeddings()
    before, after = user_ids(tokenizer, prompt)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    texts = []
    for i in range(0, grids.shape[0], batch):
        grid = grids[i:i + batch]
        if pooled:
            grid = F.avg_pool2d(grid, kernel_size=2, stride=2, ceil_mode=True)
        image = projector(grid.flatten(2).transpose(1, 2))
        n = image.shape[0]
        embeds = torch.cat([embed(torch.tensor(before)).expand(n, -1, -1), image,
                            embed(torch.tensor(after)).expand(n, -1, -1)], dim=1)
        out = lm.generate(
            inputs_embeds=embeds,
            attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=eos,
            eos_token_id=eos,
        )
        texts += tokenizer.batch_decode(out, skip_special_tokens=True)
    return texts


def names_correctly(text: str, item: LabelledImage) -> bool:
    """The answer names the image's colour and shape and no other colour or shape."""
    words = set(text.lower().replace(".", " ").replace(",", " ").split())
    colors = {c for c in COLORS if c in words} | ({"gray"} if "grey" in words else set())
    shapes = {s for s in SHAPES if s in words or s + "s" in words}
    return colors == {item.color} and shapes == {item.shape}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=PROJECTOR_FILE.parent)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-images", type=int, default=1000)
    parser.add_argument("--eval-images", type=int, default=200)
    parser.add_argument("--answer-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=150)
    parser.add_argument("--warm-steps", type=int, default=300)
    args = parser.parse_args()
    start = time.perf_counter()
    seed_everything(args.seed)
    rng = random.Random(args.seed)
    train = rng.sample(load_split("train"), args.train_images)
    held_out = rng.sample(load_split("test"), args.eval_images)
    vision = VisionEncoder()
    train_grids, eval_grids = extract_grids(vision, train), extract_grids(vision, held_out)
    log(f"features: {len(train)} train, {len(held_out)} held-out test images", start)

    labels = torch.tensor([class_index(item) for item in train])
    heads = train_captioner(ShapeHeads.pool(train_grids), labels)
    with torch.no_grad():
        color, shape = heads(ShapeHeads.pool(eval_grids))
    eval_labels = torch.tensor([class_index(item) for item in held_out])
    caption_accuracy = float(((color.argmax(1) == eval_labels[:, 0])
                              & (shape.argmax(1) == eval_labels[:, 1])).float().mean())
    log(f"captioner held-out accuracy {caption_accuracy:.3f}", start)

    lm, tokenizer = load_language_model(torch.float32)
    examples = build_examples(tokenizer, lm, train, args.answer_tokens, start, rng)
    teacher_lengths = [len(a) for kind in ("open", "reasoning") for _, _, a in examples[kind]]
    teacher_examples = [
        {"prompt": p, "caption": f"a {COLORS[k[0]]} {SHAPES[k[1]]}",
         "answer": tokenizer.decode(a, skip_special_tokens=True)}
        for kind in ("open", "reasoning") for p, k, a in examples[kind][:1]
    ]
    log(f"teacher answers: mean {np.mean(teacher_lengths):.1f} tokens", start)
    train_start = time.perf_counter()
    def evaluate(projector: Projector, pooled: bool = False, n: int | None = 48) -> float:
        answers = greedy_answers(lm, tokenizer, projector, eval_grids[:n], EVAL_PROMPT, pooled,
                                 max_new_tokens=10)
        return float(np.mean([names_correctly(a, item) for a, item in zip(answers, held_out)]))

    projector, losses, curve = train_projector(
        lm, tokenizer, train_grids, train, examples, args.steps, args.batch, args.lr, start, rng,
        evaluate, args.eval_every, args.warm_steps,
    )
    projector_seconds = time.perf_counter() - train_start

    metrics = {"seed": args.seed, "train_images": len(train), "eval_images": len(held_out),
               "steps": args.steps, "warm_steps": args.warm_steps, "batch": args.batch,
               "eval_prompt": EVAL_PROMPT, "captioner_accuracy": caption_accuracy,
               "projector_train_seconds": round(projector_seconds, 1),
               "final_loss": round(float(np.mean(losses[-25:])), 4),
               "teacher_answer_tokens_mean": round(float(np.mean(teacher_lengths)), 1),
               "teacher_examples": teacher_examples}
    metrics["accuracy_curve_first_48"] = curve
    for pooled in (False, True):
        accuracy = evaluate(projector, pooled, n=None)
        metrics[f"short_prompt_accuracy_{'pooled' if pooled else 'full'}"] = accuracy
        log(f"held-out short-prompt accuracy ({'pooled' if pooled else 'full'} tokens): "
            f"{accuracy:.3f}", start)
    samples = greedy_answers(lm, tokenizer, projector, eval_grids[:2], OPEN_PROMPTS[0], False,
                             max_new_tokens=96)
    metrics["describe_examples"] = [{"label": held_out[i].caption, "answer": a}
                                    for i, a in enumerate(samples)]
    metrics["total_seconds"] = round(time.perf_counter() - start, 1)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    metrics["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 1)  # both cores together

    args.out.mkdir(parents=True, exist_ok=True)
    projector.save(args.out / PROJECTOR_FILE.name)
    heads.save(args.out / CAPTIONER_FILE.name)
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log(f"wrote {args.out}: {json.dumps({k: v for k, v in metrics.items() if not k.endswith('examples')})}",
        start)


if __name__ == "__main__":
    main()
