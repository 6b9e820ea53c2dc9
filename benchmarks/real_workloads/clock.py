"""The clock of the real workloads: their sizes, timed calls, and rounds that go on while aitune tunes.

Shared by `workload.py` and `generation_patterns.py` (the scripts import nothing of aitune: `tuning_underway`
reads aitune's worker only when the env var has loaded it).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Size:
    prompt_lengths: tuple[int, ...]
    new_tokens: int
    generate_calls: int
    denoise_steps: int
    images: int


SIZES = {
    "tiny": Size(prompt_lengths=(5, 7, 9), new_tokens=6, generate_calls=3, denoise_steps=4, images=2),
    "real": Size(prompt_lengths=(16, 24, 32), new_tokens=32, generate_calls=10, denoise_steps=10, images=2),
}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any], times: list[float]) -> Any:
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    times.append(time.perf_counter() - start)
    return result


#: `--until-tuned`: keep producing results for at most this long while aitune's background worker is busy
UNTIL_TUNED_S = 0.0


def tuning_underway() -> bool:
    """True while aitune's background worker has a job running or queued (False without aitune)."""
    worker = sys.modules.get("aitune_jit.worker")
    return worker is not None and bool(worker.pending())


def rounds(configured: int, clock: dict[str, float]) -> Iterator[int]:
    """Round numbers: `configured` of them, then (with `--until-tuned`) more while tuning runs - until a whole
    cycle of `configured` rounds ran with the worker idle (a graph seen for the first time in such a cycle, the
    prefill of a prompt length not tuned yet, starts a new job) - then `configured` again. Records in `clock` when
    the worker went idle for good (the start of the idle cycle)."""
    start = time.perf_counter()
    yield from range(configured)
    if UNTIL_TUNED_S <= 0 or "aitune_jit.worker" not in sys.modules:
        return
    extra = configured
    while True:
        while tuning_underway() and time.perf_counter() - start < UNTIL_TUNED_S:
            yield extra
            extra += 1
        idle_since = time.perf_counter() - start
        busy = False
        for _ in range(configured):
            yield extra
            extra += 1
            busy = busy or tuning_underway()
        if not busy or time.perf_counter() - start >= UNTIL_TUNED_S:
            break
    clock["tuned_after_s"] = idle_since
    yield from range(extra, extra + configured)
