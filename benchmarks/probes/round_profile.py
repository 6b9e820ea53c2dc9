"""What a few rounds of a loop spend, from `torch.profiler`: host time, device time, and the calls that make the
host wait for the device.

Why: on an H100 and an H200 the JIT's steady state in `stepped_denoiser`'s UNet loop stayed at 0.68-0.77x
`torch.compile`'s (about 1.6 ms more per call), while on the CPU the same rounds ran the same ops in the same
time. A cost that shows only on a GPU is host work the device cannot hide: a synchronizing copy or wait between
calls exposes the host time before it. So a profile of a few rounds per contender reports, besides the time, how
often the host waited (`cudaStreamSynchronize`, `cudaMemcpy*`, `cudaEventSynchronize`, ...) and the ops that cost
the host the most.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

#: runtime calls (by substring of the profiler's event name) that can make the host wait for the device
WAITS = ("Synchronize", "Memcpy", "StreamWaitEvent", "cudaMalloc", "cudaFree", "GraphLaunch")
TOP = 15


def _device_us(event: Any) -> float:
    """An event's own device time in us (`self_device_time_total`; older torch names it `self_cuda_time_total`)."""
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)) or 0.0)


def _activities(device: torch.device) -> list[Any]:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]


def summarize(events: Any, rounds: int, calls_per_round: int, wall_s: float) -> dict[str, Any]:
    """The profile's figures per round and per call (module docstring), from `profile.key_averages()`."""
    averages = list(events)
    waits = {e.key: e.count for e in averages if any(mark in e.key for mark in WAITS)}
    kernels = [e for e in averages if _device_us(e) > 0 and e.self_cpu_time_total == 0]
    device_us = sum(_device_us(e) for e in kernels)
    host_ops = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP]
    top_kernels = sorted(kernels, key=_device_us, reverse=True)[:TOP]
    calls = max(rounds * calls_per_round, 1)
    return {
        "rounds": rounds,
        "wall_ms_per_round": round(wall_s * 1e3 / max(rounds, 1), 3),
        "device_ms_per_round": round(device_us / 1e3 / max(rounds, 1), 3),
        "waits_per_call": {key: round(count / calls, 3) for key, count in sorted(waits.items())},
        "top_host_ops": [[e.key, e.count, round(e.self_cpu_time_total / 1e3, 3)] for e in host_ops],
        "top_kernels": [[e.key[:120], e.count, round(_device_us(e) / 1e3, 3)] for e in top_kernels],
    }


def profile_rounds(run_round: Callable[[int], None], rounds: int, calls_per_round: int,
                   device: torch.device) -> dict[str, Any]:
    """Run `run_round(i)` for `rounds` rounds under the profiler (after the caller's own rounds: warm) and
    summarize them (`summarize`); the rounds end with a device synchronization each, as the caller's timed ones."""
    from torch.profiler import profile

    with profile(activities=_activities(device)) as recorded:
        start = time.perf_counter()
        for index in range(rounds):
            run_round(index)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - start
    return summarize(recorded.key_averages(), rounds, calls_per_round, wall_s)
