"""What a walltime was measured on: the device by name, the library versions and how busy the
machine was.

Result rows and benchmark logs carry these, so timings from an H100 and an L40S, or from
torch 2.11 and 2.13, are never pooled or compared as if they were one machine.
"""
from __future__ import annotations

import os
import platform
from functools import lru_cache
from typing import Callable

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


def machine_load() -> float | None:
    """The 1-minute load average: threads running or waiting for a core, smoothed over a
    minute, machine-wide. Above `cpu_cores()`, something competed with what was timed."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not every platform has one
        return None


def cpu_cores() -> int:
    """The machine's cores, as the load average counts them (all of them, not this process's share)."""
    return os.cpu_count() or 1


EnergyMeter = Callable[[], float]  # joules the device has used since its driver loaded


@lru_cache(maxsize=None)
def energy_meter(device: torch.device | str) -> EnergyMeter | None:
    """NVML's energy counter of an NVIDIA GPU, in joules (millijoule resolution, updated by the
    driver every few milliseconds), or None where there is none to read: a CPU, no `pynvml`
    (the `nvidia-ml-py` package), or a GPU without the counter. Never a made-up zero."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device() if device.index is None
                                                   else device.index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:  # no pynvml, no driver, or a GPU without the counter: unmeasured
        return None
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000
