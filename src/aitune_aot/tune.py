"""`aitune.torch.tune`: record every wrapped module on a dataset, then tune them one by one."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from aitune_aot.module import ModuleState
from aitune_aot.registry import MODULE_REGISTRY
from aitune_aot.samples import samples_generator, validate_batch_sizes
from aitune_aot.strategy_choice import validate_strategies
from aitune_core.context import BATCH_SIZE_KEY, global_context
from aitune_core.device_check import unavailable
from aitune_core.errors import ConfigError
from aitune_core.log import format_duration, install_stderr_warnings

if TYPE_CHECKING:
    from aitune_core.strategies.strategy import TuneStrategy

__all__ = ["tune"]

_logger = logging.getLogger("aitune.aot.tune")


@contextmanager
def _progress(num_batch_sizes: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar over batch sizes when stderr is a terminal; otherwise nothing (log lines only)."""
    if not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("Recording samples", total=num_batch_sizes)
        yield lambda: progress.advance(task)


def _record(func: Callable[..., Any], generator: Iterator[tuple[int, tuple, dict]], num_batch_sizes: int) -> None:
    def finish(batch_size: int, count: int, start: float) -> None:
        _logger.info(
            "Recorded batch size %d: %d batch(es) in %s",
            batch_size,
            count,
            format_duration(time.perf_counter() - start),
        )

    current, count, start = None, 0, 0.0
    with _progress(num_batch_sizes) as advance, torch.no_grad():
        for batch_size, args, kwargs in generator:
            if batch_size != current:
                if current is not None:
                    finish(current, count, start)
                    advance()
                current, count, start = batch_size, 0, time.perf_counter()
                _logger.info("Recording batch size %d", batch_size)
            with global_context:
                global_context.set(BATCH_SIZE_KEY, batch_size)
                func(*args, **kwargs)
            count += 1
        if current is not None:
            finish(current, count, start)
            advance()


def tune(
    func: Callable[..., Any],
    dataset: Any,
    batch_sizes: Iterable[int] = (1, 2),
    max_num_batches_per_batch_size: int | None = None,
    device: torch.device | str | None = None,
    strategy: TuneStrategy | None = None,
    dry_run: bool = False,
) -> None:
    """Record the wrapped modules while `func` runs on the dataset, then tune each of them.

    Every `aitune.torch.Module` alive in this process that is not tuned yet is put in recording. `func`
    (a model, a pipeline, any callable) is called under `torch.no_grad()` with batches of the dataset
    (see `samples_generator`) for every batch size, with the batch size published in the global context.
    The modules that recorded calls are then tuned one at a time (the others are deactivated meanwhile, to
    free memory) and finally all tuned modules are activated. Modules that `func` never called go back to
    passthrough. At least two batch sizes are needed to detect batch axes; with one, shapes are static.

    Args:
        func: callable that runs the model on one batch: `func(*args, **kwargs)`.
        dataset: sequence of unbatched samples (tensor, tuple/list of positional args, dict of kwargs) or
            a `torch.utils.data.Dataset`.
        batch_sizes: batch sizes to record.
        max_num_batches_per_batch_size: cap on calls per batch size (default: the whole dataset).
        device: device to tune on (default: each module's device).
        strategy: strategy for modules that were not given one (default: `aitune_aot.module.default_strategy()`).
        dry_run: record and log what would be tuned, without building anything; modules end in passthrough.
    """
    if not callable(func):
        raise TypeError(f"func must be callable (a model or a function), got {type(func).__name__}")
    if strategy is not None:
        validate_strategies(strategy, None)
    install_stderr_warnings()  # (its calls outside the tuned ranges warn once, visibly: see aitune_core.log)
    if device is not None:
        try:
            target = torch.device(device)
        except (RuntimeError, TypeError) as exc:  # ("gpu": torch's own message named no argument)
            raise ConfigError(f"tune(device={device!r}): not a torch device ({exc})") from None
        if (missing := unavailable(target)) is not None:
            raise ConfigError(f"tune(device={str(device)!r}): {missing}")  # (it tuned on the CPU without a word)
    sizes = validate_batch_sizes(batch_sizes)
    generator = samples_generator(dataset, sizes, max_num_batches_per_batch_size)
    if len(sizes) == 1:
        _logger.warning("Only one batch size given (%d): shapes are treated as static (no batch axis)", sizes[0])

    modules = MODULE_REGISTRY.modules()
    if not modules:
        raise ValueError(
            "tune() found no aitune.torch.Module to tune; wrap modules with aitune.torch.Module(...) first"
        )
    for module in modules:
        if module.state is ModuleState.TUNED:
            _logger.info(
                "Module `%s` is already tuned; skipped (enable_recording(force=True) re-tunes it)", module.name
            )
    candidates = [module for module in modules if module.state is not ModuleState.TUNED]
    if not candidates:
        _logger.warning("Every aitune Module is already tuned; nothing to do")
        return

    for module in candidates:
        module.enable_recording()
    try:
        _record(func, generator, len(sizes))
    except BaseException:
        for module in candidates:
            module.enable_passthrough()  # keeps what was recorded; a later enable_recording() continues it
        raise

    to_tune = []
    for module in candidates:
        if module.graph_specs:
            to_tune.append(module)
        else:  # (a module whose calls changed their arguments was called: it said why when it saw that)
            if module._self_not_replayable is None:
                _logger.warning("Module `%s` was not called by func; it stays in passthrough", module.name)
            module.enable_passthrough()

    try:
        for module in to_tune:
            for other in modules:
                if other is not module:
                    other.deactivate()
            module.tune(device=device, strategy=strategy, dry_run=dry_run)
    finally:
        for module in modules:
            if module.state is ModuleState.TUNED:
                module.activate()
            elif module.state is ModuleState.RECORDING:
                module.enable_passthrough()  # dry run or failed tuning: keep the recording for a later run
