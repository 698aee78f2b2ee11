"""Train the embedded target's EAGLE head (`embedded:head`), seeded, on a CPU.

    python scripts/train_embedded_head.py [--out pipeline/assets/embedded/head] [--teacher-cache FILE]

EAGLE-1's recipe (SafeAILab/EAGLE `eagle/train/main.py`) at the embedded target's size, on the
data the small draft learns from (`scripts/train_small_draft.py`'s first- and second-turn prompts
on easy-VQA train images and their held-out split):
1. teacher: the target's greedy answers to those prompts, from its own M prompt embeddings;
2. the target's last hidden state (after its final norm) at every position of each prompt and
   answer, computed once;
3. the head (`pipeline.models.heads.eagle.EagleHead`: `fc` and one decoder layer at the target's
   width) reads each token beside the target's state one position earlier, with uniform noise
   on that state (EAGLE's, std 0.2 scaled to the states' size), and is trained to predict the
   next state (smooth L1) and, through the target's frozen LM head, the teacher's next token
   (cross-entropy, weight 0.1, over the small draft's output vocabulary: the teacher's tokens
   and SmolLM2's commonest), at the answers' positions;
4. the weights, fp16-rounded in EAGLE's own files, are loaded back through the grid's loader and
   scored live on held-out test samples (tau of M, a chain at gamma 5; heads are never
   replayed) and by `calibrate` (Tq/Tp); metrics.json records these, the losses and the times.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.data.loading import load_samples  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.loop import speculative_decode  # noqa: E402
from pipeline.decoding.step_costs import calibrate  # noqa: E402
from pipeline.drafting.methods import method_embeddings  # noqa: E402
from pipeline.models.embedded import HEAD_DIR, load_embedded  # noqa: E402
from pipeline.models.embedded_parts.small_draft import output_vocabulary  # noqa: E402
from pipeline.models.heads import load_head  # noqa: E402
from pipeline.models.heads.eagle import EagleHead  # noqa: E402
from pipeline.models.tiny_heads import eagle_config  # noqa: E402

HELD_OUT_DATASETS = ("embedded_describe", "embedded_vqa", "embedded_compare")
FEATURE_NOISE = 0.2  # EAGLE's uniform noise on the states it reads, relative to their RMS
TOKEN_WEIGHT = 0.1  # EAGLE's weight of the token loss beside the state loss


def small_draft_data():
    """`scripts/train_small_draft.py`, for its prompts, teacher and image cache (one recipe of data)."""
    spec = importlib.util.spec_from_file_location("train_small_draft",
                                                  ROOT / "scripts" / "train_small_draft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log(message: str, start: float) -> None:
    print(f"[{time.perf_counter() - start:7.1f}s] {message}", flush=True)


@torch.no_grad()  # not inference mode: the head's training reads these tensors
def target_states(target, data: list, cache) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Per example: its input rows (M prompt, then the answer's embeddings), the target's last
    hidden state at each, and where the answer starts."""
    out = []
    for text, paths, answer in data:
        prompt = method_embeddings(target, "M", target.tokenize_prompt(text), [cache.image(p) for p in paths])
        rows = torch.cat([prompt, target.embed_tokens(torch.tensor(answer))])
        states = target.model(inputs_embeds=rows[None], output_hidden_states=True).hidden_states[-1][0]
        out.append((rows, states, prompt.shape[0]))
    return out


def example_loss(head: EagleHead, vocabulary: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor,
                 states: torch.Tensor, answer_from: int, answer: list[int], scale: float) -> torch.Tensor:
    """EAGLE-1's loss on one example's answer. Row j of the head reads token j + 1 beside the
    (noised) state at j and predicts the state at j + 1, which the target's LM head turns into
    token j + 2: the states at the answer's positions, and its tokens after the first."""
    read = states[:-1] + (torch.rand_like(states[:-1]) - 0.5) * 2 * FEATURE_NOISE * scale
    fused = head.fuse(rows[1:], read)[None]
    n = fused.shape[1]
    mask = torch.full((n, n), torch.finfo(fused.dtype).min).triu(1)[None, None]
    predicted = head(fused, mask, torch.arange(n)[None], None)[0]
    state_loss = F.smooth_l1_loss(predicted[answer_from - 1:], states[answer_from:])
    head_rows, position = vocabulary
    logits = predicted[answer_from - 1 : n - 1] @ head_rows.T
    return state_loss + TOKEN_WEIGHT * F.cross_entropy(logits, position[torch.tensor(answer[1:])])


def train(head: EagleHead, lm_head: torch.Tensor, vocabulary: torch.Tensor, examples: list, answers: list,
          steps: int, batch: int, lr: float, rng: random.Random, start: float) -> list[float]:
    """AdamW as EAGLE trains (betas 0.9, 0.95), a one-cycle schedule; `vocabulary`: the token
    ids the token loss ranks (the LM head's rows for them, and each id's place among them)."""
    scale = float(torch.cat([s for _, s, _ in examples]).pow(2).mean().sqrt())
    position = torch.full((lm_head.shape[0],), -1, dtype=torch.long)
    position[vocabulary] = torch.arange(len(vocabulary))
    ranked = (lm_head[vocabulary], position)
    optimiser = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=lr, total_steps=steps, pct_start=0.05)
    head.train()
    losses = []
    for step in range(steps):
        chosen = rng.sample(range(len(examples)), batch)
        loss = sum(example_loss(head, ranked, *examples[i], answers[i], scale) for i in chosen) / batch
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        optimiser.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0 or step == 0:
            log(f"step {step + 1}/{steps} loss {sum(losses[-50:]) / len(losses[-50:]):.4f}", start)
    return losses


def held_out_tau(target, head, per_dataset: int, max_new_tokens: int) -> dict:
    """Tau of M on a chain at gamma 5, decoded live (heads are never replayed), pooled."""
    samples = [s for name in HELD_OUT_DATASETS for s in load_samples(name, limit=per_dataset)]
    config = DecodeConfig("M", gamma=5, max_new_tokens=max_new_tokens)
    records = [speculative_decode(target, head, [s], config)[0] for s in samples]
    accepted, blocks = sum(sum(r.accepted_per_block) for r in records), sum(r.blocks for r in records)
    return {"samples": [s.sample_id for s in samples], "tau_M": round(1 + accepted / blocks, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HEAD_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=220,
                        help="easy-VQA train images for first-turn prompts")
    parser.add_argument("--second-turns", type=int, default=110)
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--held-out", type=int, default=5, help="test samples per scenario to score")
    parser.add_argument("--teacher-cache", type=Path,
                        help="JSON file to keep the teacher's answers in (and reuse)")
    args = parser.parse_args()
    start = time.perf_counter()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    recipe = small_draft_data()

    target = load_embedded("target")
    cache = recipe.ImageCache(target, None)  # M alone: no captions
    if args.teacher_cache and args.teacher_cache.is_file():
        saved = json.loads(args.teacher_cache.read_text())
        first, second = ([(t, tuple(i), a) for t, i, a in saved[k]] for k in ("first", "second"))
    else:
        first = recipe.teacher_answers(target, recipe.first_turn_prompts(args.images, rng), cache,
                                       args.answer_tokens)
        second = recipe.teacher_answers(
            target, recipe.second_turn_prompts(first, args.second_turns, target.tokenizer, rng), cache,
            args.answer_tokens)
        if args.teacher_cache:
            args.teacher_cache.write_text(json.dumps({"first": first, "second": second}))
    data = [example for example in first + second if len(example[2]) >= 2]
    teacher_seconds = time.perf_counter() - start
    log(f"teacher: {len(data)} answers, {sum(len(a) for *_, a in data)} tokens", start)
    examples = target_states(target, data, cache)
    log("target states computed", start)

    head = EagleHead(eagle_config(target.model))
    lm_head = target.model.get_output_embeddings().weight.detach()
    vocabulary = torch.tensor(output_vocabulary(answer for *_, answer in data))
    losses = train(head, lm_head, vocabulary, examples, [a for *_, a in data], args.steps, args.batch,
                   args.lr, random.Random(args.seed + 1), start)
    train_seconds = time.perf_counter() - start - teacher_seconds
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "__init__.py").touch()
    (args.out / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
    save_file({k: v.detach().half().contiguous() for k, v in head.state_dict().items()},
              args.out / "model.safetensors")

    score_start = time.perf_counter()
    shipped = load_head("eagle", str(args.out), target)  # as the grid loads it, fp16-rounded
    scored = held_out_tau(target, shipped, args.held_out, args.answer_tokens)
    log(f"held-out tau: {scored['tau_M']}", start)
    ratios = calibrate(target, shipped, gammas=(5,), repeats=10, rounds=3)
    metrics = {
        "seed": args.seed, "images": args.images, "examples": len(data), "answer_tokens": args.answer_tokens,
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "feature_noise": FEATURE_NOISE,
        "token_weight": TOKEN_WEIGHT, "parameters": sum(p.numel() for p in head.parameters()),
        "loss_first_50": round(sum(losses[:50]) / 50, 4), "loss_last_50": round(sum(losses[-50:]) / 50, 4),
        "held_out": scored, "tq_over_tp": round(ratios.ratio_draft_target, 4),
        "tp_ms": round(1e3 * ratios.target_token_s, 2), "tq_ms": round(1e3 * ratios.draft_token_s, 2),
        "teacher_seconds": round(teacher_seconds, 1), "train_seconds": round(train_seconds, 1),
        "score_seconds": round(time.perf_counter() - score_start, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log(f"wrote {args.out}: tau {scored['tau_M']}, Tq/Tp {metrics['tq_over_tp']}", start)


if __name__ == "__main__":
    main()
