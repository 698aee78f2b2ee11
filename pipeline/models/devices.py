"""What a walltime was measured on: the device by name and the library versions.

Result rows and benchmark logs carry these, so timings from an H100 and an L40S, or from
torch 2.11 and 2.13, are never pooled or compared as if they were one machine.
"""
from __future__ import annotations

import platform
from functools import lru_cache

import torch
import transformers


def device_name(device: torch.device | str) -> str:
    """`NVIDIA H100 80GB HBM3` for a GPU; for a CPU its model and the threads torch computes
    with (threads change a CPU's timings), e.g. `cpu: AMD EPYC (2 threads)`."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}: {processor_name()} ({torch.get_num_threads()} threads)"


@lru_cache(maxsize=1)
def processor_name() -> str:
    """The CPU model, e.g. `AMD EPYC`."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown processor"


def library_versions() -> dict[str, str]:
    """The versions that change a timing: torch (with its CUDA build) and transformers."""
    return {"torch_version": torch.__version__, "transformers_version": transformers.__version__}
