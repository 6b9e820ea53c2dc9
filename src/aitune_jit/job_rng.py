"""A tuning job on a worker thread never rewinds the program's random number streams or process-wide settings.

Why: when dynamo compiles a frame it saves the process-wide random states (torch's default CPU generator, the
current CUDA device's generator, Python's `random`) and puts them back when the compile ends, so that compiling
draws nothing. That is right on the thread that asked for the compile, with nothing else running. A background
job compiles while the program runs on, and every number the program drew in the meantime - sampling in
`generate()`, a diffusion step's noise, `random.random()` - is taken back when the job's compile ends: the program
draws the same numbers again. Plain `torch.compile` on a second thread does the same (this CPU: 4 of 240 draws of
`torch.rand` and 2 of 240 of `random.random` repeated while one compile ran beside them).

The same holds for the process-wide settings dynamo saves and puts back (`PROCESS_SETTINGS`: the default dtype,
deterministic algorithms, the float32 matmul precision): a program that changed one while a job compiled found it
changed back (`torch.set_float32_matmul_precision("high")` read back as "none" after a background job, and a
program that had set the legacy `allow_tf32` flag then died reading it: torch refuses a mix of its two APIs).

How: while a thread is inside `on_job_thread()` (the worker's job and side-job bodies), `torch.set_rng_state`,
`torch.random.set_rng_state`, `torch.cuda.set_rng_state`, `random.setstate`, `torch.set_default_dtype`,
`torch.use_deterministic_algorithms` and `torch._C._set_fp32_precision_setter` do nothing on that thread; on every
other thread they are torch's and Python's own. A job has nothing of its own to undo there: what it replays draws no
random numbers (a module whose recorded calls draw is not tuned, `aitune_core/recording/module_effects.py`),
validation makes its inputs with a generator of its own, and compiling draws nothing. The patches
(`aitune_core.patch.Patch`) are applied by `install()` before the first job starts and taken off by `uninstall()`
when JIT tuning is switched off.

One more draw came from an import: `rich.style` (the tables and history aitune prints) takes one number from
Python's `random` when it is first imported, which aitune did lazily, on a job thread or inside a blocking tune.
`preload_rich()` imports it when the hook is installed, on the program's thread, and puts Python's random state
back as it was.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from aitune_core.patch import Patch

_logger = logging.getLogger("aitune.jit")


class _JobThread(threading.local):
    inside = 0


_local = _JobThread()
_lock = threading.Lock()
_patches: list[Patch] = []


@contextlib.contextmanager
def on_job_thread() -> Iterator[None]:
    """Mark the calling thread as a job's for the block: random-state restores are skipped there."""
    _local.inside += 1
    try:
        yield
    finally:
        _local.inside -= 1


def skipped_here() -> bool:
    """True on a thread inside `on_job_thread()`."""
    return _local.inside > 0


def _skip_on_job_thread(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def restore(*args: Any, **kwargs: Any) -> Any:
        if _local.inside:  # (no logging here: it runs at each compile's end, where an exit cancel often lands)
            return None
        return original(*args, **kwargs)

    restore.__aitune_job_rng__ = True  # type: ignore[attr-defined]
    return restore


#: process-wide settings dynamo also saves and puts back around a compile: a program that switched its default dtype
#: (or deterministic algorithms) while a job compiled had the change undone when the compile ended (a reviewer's
#: script: `torch.set_default_dtype(torch.float64)`, then float32 again a moment later)
PROCESS_SETTINGS: tuple[tuple[Any, str], ...] = ((torch, "set_default_dtype"), (torch, "use_deterministic_algorithms"),
                                                 (torch._C, "_set_fp32_precision_setter"))


def _targets() -> list[tuple[Any, str]]:
    targets: list[tuple[Any, str]] = [(torch, "set_rng_state"), (torch.random, "set_rng_state"), (random, "setstate"),
                                      *PROCESS_SETTINGS]
    cuda_random = getattr(torch.cuda, "random", None)
    targets.append((torch.cuda, "set_rng_state"))
    if cuda_random is not None and hasattr(cuda_random, "set_rng_state"):
        targets.append((cuda_random, "set_rng_state"))
    return targets


def install() -> None:
    """Apply the patches (idempotent)."""
    with _lock:
        if _patches:
            return
        for parent, name in _targets():
            current = getattr(parent, name, None)
            if current is None or getattr(current, "__aitune_job_rng__", False):
                continue
            _patches.append(Patch(parent, name, _skip_on_job_thread(current)).apply())


def uninstall() -> None:
    """Take the patches off (each only if nobody replaced it since: `Patch.restore`)."""
    with _lock:
        while _patches:
            _patches.pop().restore()


def installed() -> bool:
    return bool(_patches)


def preload_rich() -> None:
    """Import `rich.style` now without moving Python's random stream (module docstring). Never raises."""
    if "rich.style" in sys.modules:
        return
    state = random.getstate()
    try:
        import rich.style  # noqa: F401
    except Exception:  # (rich is a dependency; without it nothing of aitune's printing works anyway)
        _logger.debug("rich.style could not be imported", exc_info=True)
    finally:
        random.setstate(state)
