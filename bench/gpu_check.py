"""One GPU check that fits a lent GPU's budget: sections in priority order, each in a process of
its own with its share of `--budget-s` (time a section leaves unused passes on to the next),
each printing its `name=value` lines as soon as it finishes, into a raw log as well.

    python bench/gpu_check.py --shapes 7b --budget-s 540      # a lent GPU: everything below
    python bench/gpu_check.py --shapes 7b --family qwen2_5_vl --budget-s 540   # on Qwen2.5-VL 7B/3B shapes
    python bench/gpu_check.py --shapes tiny --budget-s 240    # a CPU: every section it can

Sections (`bench/gpu_sections.py`), most important first:
- (first, no share) device, torch, transformers: what ran;
- head: a real-shaped EAGLE head (`bench/head_shapes.py`) on the LLaVA target: head_params_m,
  head_step_ms, head_tau_chain / head_tau_eagle2 (EAGLE-2's tree at MMSpec's setting),
  head_sd_speedup_chain / _eagle2 over our AR, head_chain_equals_ar / head_eagle2_equals_ar, and
  head_steps (captured on a GPU); LLaVA shapes only (`--family llava`);
- exact: exact_fp32 / exact_fp16, greedy SD outputs equal to AR's on the device (tiny pair, every
  verify kind, batch 1 and 3, eager engine: the GPU-only tests hold captured steps to eager's),
  and bf16_divergence, the share that differ in bf16, with
  bf16_first_divergence, the earliest token where one does;
- decode: the real-shaped pair built, compiled and captured once for three parts, each followed by
  a `# <part> done at N s` line: target_step_ms (our AR decode step, static engine) beside floor_ms
  (the step's weight bytes over copy_bandwidth_gb_s, measured with a copy kernel);
  sd_speedup_M, sd_speedup_MTstar (over our AR), hf_assisted_speedup (transformers' assisted
  generation over its own greedy AR), outputs compared, and energy_j_per_token_ar,
  energy_j_per_token_sd_M, energy_j_per_accepted_token_sd_M from NVML's energy counter read
  around the timed decodes only; batch_speedup_<B>, SD M over AR at the same batch size B
  (1, 4, 16; tiny: 1, 2, 4);
- ssm_step: ssm_step_ms of a Mamba2 draft (130M) beside llama_draft_step_ms (68M) after a
  2048-token context;
- gpu_tests: gpu_tests_passed / _failed, the GPU-only tests (they compile for a minute or more);
- spread, on a machine of two GPUs or more (else `spread=unmeasured`): the real-shaped target on
  one GPU, then spread over two as a pair given `gpus: 2` runs: spread_ar_equals_one_gpu,
  spread_sd_equals_one_gpu (greedy outputs, N/3), and one_gpu_/spread_{ar,sd}_tokens_per_s.
A section that cannot run says `unmeasured` and why; one that outruns its share is stopped and
said `unmeasured (out of time)`; sections the budget never reached are named in `skipped=`.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# shares of the budget (device, torch and transformers are read in the parent first), from a cold
# H100 at 520 s: exact needs about 22 s per dtype (68 s stopped it before bf16), decode 284 s,
# ssm_step 19 s, the GPU-only tests 80 s; the head section (first: the newest drafter) is unmeasured
SHARES = {"head": 0.16, "exact": 0.15, "decode": 0.49, "ssm_step": 0.05, "gpu_tests": 0.15}
SPREAD_SHARE = 0.12  # with two GPUs or more: a spread target's section, the others scaled down to make room
MIN_START_S = 5.0  # a section is not started with less time than this left


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=["tiny", "7b", "13b"], default="7b")
    parser.add_argument("--family", choices=["llava", "qwen2_5_vl"], default="llava",
                        help="qwen2_5_vl: a Qwen2.5-VL 7B target with its 3B draft's shapes (7b or tiny)")
    parser.add_argument("--draft", choices=["68m", "160m"], default="68m", help="the LLaVA draft's shapes")
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--log-dir", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--sections", type=lambda text: text.split(","), default=list(SHARES),
                        help=f"which to run, comma-separated, in this order: {','.join(SHARES)} "
                             "(default: all; a GPU's budget is shared among those named)")
    parser.add_argument("--batch-sizes", type=lambda text: [int(b) for b in text.split(",") if b],
                        help="decode's batch part: SD over AR at these batch sizes ('' skips it; "
                             "default 1,4,16, tiny 1,2,4)")
    # the child: one section, in this process
    parser.add_argument("--section", choices=[*SHARES, "spread"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_s <= 0 or args.max_new_tokens <= 0:
        parser.error("--budget-s and --max-new-tokens must be positive")
    if args.family == "qwen2_5_vl" and args.shapes == "13b":
        parser.error("--family qwen2_5_vl has --shapes 7b (the 7B target, 3B draft) or tiny")
    if unknown := sorted(set(args.sections) - set(SHARES)):
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SHARES)}")
    if args.batch_sizes is None:
        args.batch_sizes = [1, 2, 4] if args.shapes == "tiny" else [1, 4, 16]
    if any(b < 1 for b in args.batch_sizes):
        parser.error("--batch-sizes must be positive")
    return args


def shares(gpus: int, named: list[str] | None = None) -> dict[str, float]:
    """Each section's share of the budget on a machine of `gpus` GPUs, among the `named` ones
    (default: all)."""
    chosen = {name: SHARES[name] for name in SHARES if named is None or name in named}
    chosen = {name: share / sum(chosen.values()) for name, share in chosen.items()}
    if gpus < 2:
        return chosen
    return {name: share * (1 - SPREAD_SHARE) for name, share in chosen.items()} | {"spread": SPREAD_SHARE}


def run_section(args: argparse.Namespace) -> int:
    """The child: one section's figures on stdout, or the section unmeasured and why."""
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    from bench.gpu_sections import SECTIONS

    def show(name: str | None, value: object) -> None:
        if name is None:
            print(f"# {value}", flush=True)
            return
        print(f"{name}={value:.6g}" if isinstance(value, float) else f"{name}={value}", flush=True)

    try:
        for name, value in SECTIONS[args.section](args):
            show(name, value)
    except torch.cuda.OutOfMemoryError:
        show(args.section, "unmeasured (out of memory)")
    except Exception as err:  # a section's failure must not stop the sections after it
        show(args.section, f"unmeasured ({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})")
    return 0


class Log:
    """Lines to stdout and to the raw log file at once, so a stopped check keeps what it printed."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.file = path, path.open("w")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def stream(process: subprocess.Popen, log: Log) -> threading.Thread:
    def pump() -> None:
        for line in process.stdout:
            log(line.rstrip("\n"))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def run_child(args: argparse.Namespace, section: str, seconds: float, log: Log) -> bool:
    """Run one section in its own process group for at most `seconds`; False if it was stopped."""
    command = [sys.executable, str(Path(__file__).resolve()), "--section", section, "--shapes", args.shapes,
               "--draft", args.draft, "--family", args.family, "--max-new-tokens", str(args.max_new_tokens),
               "--batch-sizes", ",".join(map(str, args.batch_sizes))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    reader = stream(process, log)
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        reader.join(timeout=5)
        log(f"{section}=unmeasured (out of time: stopped after its {seconds:.0f} s share)")
        return False
    reader.join(timeout=5)
    return True


def log_path(args: argparse.Namespace, device: str, kind: str = "gpu-check") -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    family = "" if args.family == "llava" else f"{args.family}-"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{kind}-{family}{args.shapes}-{device}").strip("-").lower()
    return args.log_dir / f"{slug}-{stamp}.txt"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.section:
        return run_section(args)
    import torch

    from bench.record import header

    deadline = time.monotonic() + args.budget_s
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    log = Log(log_path(args, name))
    command = ["python", "bench/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]
    for line in header(command, device):
        log(line)
    from bench.gpu_sections import device_section

    for name, value in device_section(args):
        log(f"{name}={value}")
    sections = shares(torch.cuda.device_count(), args.sections)
    if "spread" not in sections:
        log(f"spread=unmeasured ({torch.cuda.device_count()} GPUs here: spreading a target takes two)")
    log(f"# budget {args.budget_s:.0f} s; sections in order: {', '.join(sections)}")
    carried, skipped = 0.0, []
    for section, share in sections.items():
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            skipped.append(section)
            continue
        allowed = min(left, share * args.budget_s + carried)
        started = time.monotonic()
        run_child(args, section, allowed, log)
        carried = max(0.0, allowed - (time.monotonic() - started))
        log(f"# {section}: {time.monotonic() - started:.1f} s of {allowed:.0f}")
    log(f"skipped={','.join(skipped) if skipped else 'none'}")
    log(f"# kept: {log.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
