"""Where a real-shaped target's decode step and an SD block spend their time on the device: the
step against the weight-bandwidth floor, then torch's profiler over a few AR steps and SD blocks,
written as text tables (the kernels by device time, and the device's idle gaps between them).

    python bench/gpu_profile.py --shapes 7b                       # LLaVA-1.5 7B target, 68M draft
    python bench/gpu_profile.py --shapes 7b --family qwen2_5_vl   # Qwen2.5-VL 7B target, 3B draft
    python bench/gpu_profile.py --shapes tiny                     # a CPU: the same tables, no kernels

Figures (`name=value`): target_step_ms beside floor_ms and target_step_over_floor (as
`bench/gpu_check.py` measures them), sd_block_ms with its draft_ms_per_block and verify_ms_per_block
(SD M, gamma 5), verify_over_step (what a block's target forward costs over a plain step), and per
profiled period (an AR step, an SD block: the stretch between two device-to-host reads, each step's
and block's one transfer) period_ms, busy_ms (the device running a kernel or copy) and idle_ms, the
time the device waited for the host: launch gaps outside the captured graphs and the host's own work.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import gpu_engine  # noqa: E402
from bench.gpu_sections import family_pair, step_weight_bytes  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.engine import default_engine  # noqa: E402
from pipeline.decoding.loop import autoregressive_decode, speculative_decode  # noqa: E402
from pipeline.drafting.policies import StaticPolicy  # noqa: E402

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
KINDS = (  # a kernel's kind, by the first pattern its name matches
    ("gemm", r"gemm|gemv|cutlass|cublas|xmma|nvjet|splitk"),
    ("attention", r"attention|fmha|flash|sdpa|softmax"),
    ("fused (inductor)", r"^triton_"),
    ("copy/fill", r"memcpy|memset|copy|fill|cat"),
    ("index/scatter", r"index|scatter|gather"),
    ("reduce/argmax", r"reduce|argmax|max"),
)
TOP = 15


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=["tiny", "7b"], default="7b")
    parser.add_argument("--family", choices=["llava", "qwen2_5_vl"], default="llava")
    parser.add_argument("--draft", choices=["68m", "160m"], default="68m", help="the LLaVA draft's shapes")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per timed decode")
    parser.add_argument("--profiled-tokens", type=int, default=24, help="tokens per profiled decode")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--trace-dir", type=Path, help="also keep the profiler's traces here (gzipped)")
    return parser.parse_args(argv)


def device_events(trace: dict) -> list[dict]:
    """The trace's kernels and device copies, in start order."""
    return sorted((e for e in trace.get("traceEvents", []) if e.get("cat") in DEVICE_CATEGORIES
                   and e.get("ph") == "X"), key=lambda e: e["ts"])


def periods(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) in us between consecutive device-to-host reads, after the first read (the
    prefill's): one AR step, or one SD block, each."""
    reads = [e["ts"] + e["dur"] for e in events if e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"]]
    return list(zip(reads, reads[1:]))


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, lowered)), "other")


def analyse(trace: dict, what: str) -> list[str]:
    """Text tables of one profiled decode: kernels by device time per period, kinds, idle gaps."""
    events = device_events(trace)
    spans = periods(events)
    if not spans:
        return [f"# {what}: no device kernels in the trace (a CPU run): nothing to analyse"]
    per_name, calls, gaps = defaultdict(float), defaultdict(int), []
    busy_total = 0.0
    for start, end in spans:
        inside = [e for e in events if start <= e["ts"] < end]
        cursor = start
        for e in inside:
            e_end = min(e["ts"] + e["dur"], end)
            if e["ts"] > cursor:
                gaps.append((e["ts"] - cursor, e["name"]))
            busy_total += max(0.0, e_end - max(e["ts"], cursor))
            cursor = max(cursor, e_end)
            per_name[e["name"]] += e["dur"]
            calls[e["name"]] += 1
        if end > cursor:
            gaps.append((end - cursor, "(the period's end: the host's read and its next launch)"))
    n = len(spans)
    period_us = sum(end - start for start, end in spans) / n
    busy_us = busy_total / n
    lines = [f"# {what}: {n} periods profiled",
             f"{what}_period_ms={period_us / 1000:.4f}", f"{what}_busy_ms={busy_us / 1000:.4f}",
             f"{what}_idle_ms={(period_us - busy_us) / 1000:.4f}",
             f"{what}_kernels_per_period={sum(calls.values()) / n:.1f}"]
    kinds = defaultdict(float)
    for name, us in per_name.items():
        kinds[kind_of(name)] += us
    lines.append(f"# {what}: device time per period by kind (us, share of the period)")
    for kind, us in sorted(kinds.items(), key=lambda item: -item[1]):
        lines.append(f"#   {kind:<18} {us / n:10.1f} {100 * us / n / period_us:6.1f}%")
    lines.append(f"#   {'idle':<18} {period_us - busy_us:10.1f} {100 * (1 - busy_us / period_us):6.1f}%")
    lines.append(f"# {what}: top {TOP} kernels by device time per period (us, calls per period)")
    for name, us in sorted(per_name.items(), key=lambda item: -item[1])[:TOP]:
        lines.append(f"#   {us / n:9.1f} {calls[name] / n:6.1f}  {name[:110]}")
    runtime = defaultdict(list)  # the host's CUDA calls inside the periods
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "cuda_runtime" and e.get("ph") == "X" and any(s <= e["ts"] < t for s, t in spans):
            runtime[e["name"]].append(e["dur"])
    lines.append(f"# {what}: the host's CUDA calls per period (us, calls per period)")
    for call, values in sorted(runtime.items(), key=lambda item: -sum(item[1]))[:8]:
        lines.append(f"#   {sum(values) / n:9.1f} {len(values) / n:6.1f}  {call}")
    gap_total = sum(g for g, _ in gaps)
    small = sum(g for g, _ in gaps if g < 5)
    lines.append(f"# {what}: idle gaps per period: {len(gaps) / n:.1f}, {gap_total / n:.1f} us; gaps under "
                 f"5 us (kernel to kernel) {small / n:.1f} us, 5 us or more {(gap_total - small) / n:.1f} us")
    by_next = defaultdict(list)
    for gap, name in gaps:
        if gap >= 5:
            by_next[name[:110]].append(gap)
    lines.append(f"# {what}: gaps of 5 us or more per period, by the kernel that ended them "
                 "(us, count per period)")
    for name, values in sorted(by_next.items(), key=lambda item: -sum(item[1]))[:10]:
        lines.append(f"#   {sum(values) / n:9.1f} {len(values) / n:6.1f}  {name}")
    return lines


def profiled(decode, trace_path: Path | None) -> dict:
    """The chrome trace of one `decode()` under torch's profiler (CPU and, on a GPU, CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        decode()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        text = path.read_text()
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(trace_path, "wt") as out:
            out.write(text)
    return json.loads(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.gpu_check import Log, log_path
    from bench.record import header

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    log = Log(log_path(args, name, kind="gpu-profile"))
    for line in header(["python", "bench/gpu_profile.py", *(argv if argv is not None else sys.argv[1:])],
                       device.type):
        log(line)
    started = time.perf_counter()
    target, draft = family_pair(args, device, dtype)
    log(f"pair={target.name} <- {draft.name}")
    engine = default_engine(target, draft)
    samples = gpu_engine.make_samples(3)
    config = lambda new: DecodeConfig(methods="M", policy=StaticPolicy(), max_new_tokens=new)
    ar = lambda sample, new: autoregressive_decode(target, [sample], max_new_tokens=new, engine=engine)[0]
    sd = lambda sample, new: speculative_decode(target, draft, [sample], config(new), engine=engine)[0]
    ar(samples[0], args.max_new_tokens)  # compiles and captures every step shape timed below
    sd(samples[0], args.max_new_tokens)
    log(f"# built, compiled and captured in {time.perf_counter() - started:.0f} s")
    records = [ar(s, args.max_new_tokens) for s in samples[1:]]
    step = 1000 * sum(r.time_verify_s for r in records) / sum(r.new_tokens for r in records)
    floor = step_weight_bytes(target) / gpu_engine.copy_bandwidth_gb_s(device) / 1e6
    blocks = [sd(s, args.max_new_tokens) for s in samples[1:]]
    count = sum(len(r.accepted_per_block) for r in blocks)
    draft_ms = 1000 * sum(r.time_draft_s for r in blocks) / count
    verify_ms = 1000 * sum(r.time_verify_s for r in blocks) / count
    for key, value in {"engine": engine, "target_step_ms": step, "floor_ms": floor,
                       "target_step_over_floor": step / floor, "sd_block_ms": draft_ms + verify_ms,
                       "draft_ms_per_block": draft_ms, "verify_ms_per_block": verify_ms,
                       "verify_over_step": verify_ms / step,
                       "sd_tokens_per_block": sum(r.new_tokens for r in blocks) / count,
                       "sd_equals_ar": f"{sum(a.output_ids == b.output_ids for a, b in zip(records, blocks))}"
                                       f"/{len(blocks)}"}.items():
        log(f"{key}={value:.6g}" if isinstance(value, float) else f"{key}={value}")
    stamp = log.path.stem
    for what, decode in (("ar_step", lambda: ar(samples[1], args.profiled_tokens)),
                         ("sd_block", lambda: sd(samples[1], args.profiled_tokens))):
        trace_path = args.trace_dir / f"{stamp}-{what}.json.gz" if args.trace_dir else None
        for line in analyse(profiled(decode, trace_path), what):
            log(line)
    log(f"# done in {time.perf_counter() - started:.0f} s; kept: {log.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
