"""Tuning one node: graph-break check, strategy per ready graph, then TUNED / EAGER / dry run.

Runs on the background worker (`worker.py`, via `tune_queued`) or, with `jit_config.blocking`, in the thread
whose call made a graph ready; under the root's lock, with the hook bypassed for this thread (so nothing the
strategy runs is recorded or adopted) and gradients off. Known decisions (an identical module tuned before, in
this process or a previous one) are applied first (`decisions.py`); every new decision is published.

Backends never see the user's module directly but a `ForwardOnly` view of it: its `forward` is the module's
original forward, without the module's hooks (they keep firing outside, around the tuned forward) and
without aitune's forward wrapper (so compiled code never depends on it).
"""

from __future__ import annotations

import enum
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.module_watch import submodule_hooks
from aitune_core.errors import NotFasterThanEagerError
from aitune_core.module_info import module_device
from aitune_core.torch_log_capture import capture_torch_logs
from aitune_jit import decisions
from aitune_jit.config import jit_config
from aitune_jit.graph_breaks import find_graph_breaks
from aitune_jit.runtime import bypassed, is_installed
from aitune_jit.state import NodeState
from aitune_jit.tuning_budget import budget
from aitune_jit.worker import abandoned, sync_stream

if TYPE_CHECKING:
    from collections.abc import Callable

    from aitune_core.backends.backend import Backend
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneReport

#: a `PatchedModule` (not imported: the node imports the tuner)
PatchedModule = Any

_logger = logging.getLogger("aitune.jit")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SIMPLE_OUTPUTS = (bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum, type)


class ForwardOnly(torch.nn.Module):
    """`module`'s forward alone (no hooks, no wrapper); `module` is a submodule, so its weights are visible."""

    def __init__(self, module: torch.nn.Module, forward: Callable[..., Any]) -> None:
        super().__init__()
        self.module = module
        self.forward = forward  # the original (bound) forward: signature and behaviour of the user's module


def _ready_graphs(node: PatchedModule) -> list[GraphSpec]:
    recorder = node.recorder
    if recorder is None:
        return []
    cfg = jit_config
    done = ({spec.name for spec, _backend in node._entries} - node._growth.due) | set(node._failed)
    ready = []
    for spec in recorder.graph_specs:
        if spec.name in done or recorder.num_samples(spec) < cfg.min_samples:
            continue
        if cfg.batch_axis_required and not any(t.batch_axes() for t in spec.input_spec.tensors):
            continue
        ready.append(spec)
    return ready


def tune_node(node: PatchedModule) -> None:
    """Tune every graph of `node` that has enough recordings (see the module docstring).

    What torch logs and warns while it probes and compiles goes into the node's history, not to the console.
    """
    spent = budget.exhausted()
    if spent is not None:
        if node.state is NodeState.RECORDING:
            node.go_eager(spent, reopen=False)
        return
    start = time.perf_counter()
    with capture_torch_logs() as captured:
        try:
            _tune_node(node)
        finally:
            budget.charge(time.perf_counter() - start)
            if captured.lines:
                node._log(f"While tuning {node.short}, {captured.summary()}", logging.DEBUG)
                for line in captured.lines:
                    _logger.debug("torch, while tuning %s: %s", node.path, line)


def request_tuning(node: PatchedModule) -> None:
    """A graph of `node` is ready (the node's `_try_tune`): queue the node for the background worker, or, with
    `jit_config.blocking`, tune it now in this thread (unless another thread tunes a module of its root: then
    a later call tries again)."""
    from aitune_jit import worker

    if not jit_config.blocking:  # the call that made a graph ready never waits
        if not node._tuning:
            node._tuning, node._pending = True, False
            worker.submit(node, tune_queued)
        return
    lock = node._tune_lock
    if not lock.acquire(blocking=False):
        return
    try:
        if not node._pending or node._tuning:
            return
        node._pending = False
        node._tuning = True
        try:
            tune_node(node)
        except Exception as exc:  # a strategy, backend or aitune bug: the program carries on eagerly
            node._internal_error("tuning", exc)
        finally:
            node._tuning = False
    finally:
        lock.release()


def tune_queued(node: PatchedModule) -> None:
    """The worker's job for one node: `tune_node` under the root's lock; the node records again afterwards."""
    lock = node._tune_lock
    timeout = jit_config.tuning_timeout_s
    if not lock.acquire(timeout=-1 if timeout is None else timeout):  # a blocking-mode tuning of the root hangs
        node._tuning = False
        return
    try:
        node._pending = False
        try:
            with bypassed(), torch.no_grad():  # this thread's module calls are aitune's own
                tune_node(node)
        except Exception as exc:  # a strategy, backend or aitune bug: the program carries on eagerly
            if not abandoned():
                node._internal_error("tuning", exc)
    finally:
        node._tuning = False
        lock.release()


def _uncomparable_output(samples: dict[str, list[Sample]]) -> str | None:
    """The first recorded output object validation could never accept (no `==` of its own): found before any
    compile, instead of after one."""
    from aitune_core.specs.tree import flatten

    for graph_samples in samples.values():
        for sample in graph_samples[:1]:
            for locator, leaf in flatten(sample.output)[0]:
                if isinstance(leaf, torch.Tensor) or leaf is None or isinstance(leaf, _SIMPLE_OUTPUTS):
                    continue
                if type(leaf).__eq__ is object.__eq__:
                    where = f"output{locator}" if locator else "output"
                    return f"its {where} is a {type(leaf).__name__} object, which aitune cannot compare"
    return None


def _worthless(
    node: PatchedModule, strategy: Any, proxy: torch.nn.Module, spec: GraphSpec, samples: list[Sample], device: Any
) -> bool:
    """The strategy's cheap verdict (one torch.nn layer, an eager call too short to win back a dispatch) before
    any dynamo trace: such a node stays eager, and so do its children (they are cheaper still)."""
    check = getattr(strategy, "skip_reason", None)
    reason = check(proxy, node.path, spec, samples, device) if check is not None else None
    if reason is None:
        return False
    node.go_eager(reason, reopen=False)
    return True


def _hooked(node: PatchedModule, module: torch.nn.Module, first: bool) -> bool:
    """Hooks on submodules (or global module hooks): no backend would run them, and probing the module would
    fire them with recorded inputs. Such a node is not tuned as a whole; its children are (docs/architecture.md,
    "Tuned modules follow the model")."""
    hooks = submodule_hooks(module)
    if not hooks:
        return False
    if first:
        node.go_eager(f"{hooks} hook(s) are registered on its submodules (or globally); its submodules are tuned "
                      "instead")
    return True


def _tune_node(node: PatchedModule) -> None:
    cfg = jit_config
    cfg.validate()  # invalid options fail here at the latest, with the option's name
    module = node.module
    recorder = node.recorder
    graphs = _ready_graphs(node)
    if module is None or recorder is None or not graphs:
        return
    first = node.state is NodeState.RECORDING
    samples = {spec.name: recorder.samples(spec) for spec in graphs}
    device = cfg.device or module_device(module, samples[graphs[0].name], default=torch.device("cpu"))
    if node._proxy is None:
        node._proxy = ForwardOnly(module, node._forward_fn)  # type: ignore[arg-type]
    proxy = node._proxy
    cache_dir = cfg.cache_dir / _UNSAFE.sub("_", node.path)
    if _hooked(node, module, first):
        return
    if first:
        uncomparable = _uncomparable_output(samples)
        if uncomparable is not None:
            node.go_eager(uncomparable)
            return

    decisions.point_inductor_cache()
    with bypassed(), torch.no_grad():
        strategy = cfg.resolve_strategy(device)
        keys = {} if cfg.dry_run else decisions.keys_for(node, graphs, strategy, device)
        reused, reused_reports, finished = decisions.reuse(
            node, proxy, graphs, samples, keys, device, cache_dir, first
        )
        if finished:
            return
        first = first and not reused  # a node with a reused backend is tuned: its other graphs may only fail
        if not graphs:
            _apply(node, reused, reused_reports)
            return
        if first and _worthless(node, strategy, proxy, graphs[0], samples[graphs[0].name], device):
            decisions.remember_eager(keys.get(graphs[0].name), node, graphs[0], str(node.reason), reopen=False,
                                     persist=False)  # cheap to find again, and partly a timing
            return
        if cfg.detect_graph_breaks:
            for spec in list(graphs):
                if spec.name in node._checked_graphs:
                    continue
                node._checked_graphs.add(spec.name)
                sample = samples[spec.name][0]
                report = find_graph_breaks(proxy, sample.args, sample.kwargs)
                if not report.has_breaks:
                    node._log(f"No graph breaks in {node.short}. Checking took {report.duration_s:.2f}s")
                    continue
                what = "Dynamo could not trace" if report.error is not None else "Graph breaks in"
                node._log(
                    f"{what} {node.short} (graph {spec.name}): {report.summary()}. "
                    f"Checking took {report.duration_s:.2f}s"
                )
                cause = report.summary() if report.error is not None else f"graph break: {report.summary()}"
                decisions.remember_eager(keys.get(spec.name), node, spec, cause, reopen=True)
                if first:
                    node.go_eager(cause)
                    return
                node._failed[spec.name] = cause
                graphs.remove(spec)
            if not graphs:
                _apply(node, reused, reused_reports)
                return

        if cfg.dry_run:
            for spec in graphs:
                strategy.tune_dry_run(proxy, node.path, spec, samples[spec.name], device, cache_dir)
            names = ", ".join(spec.name for spec in graphs)
            node.go_dry_run(f"would tune {node.short} (graphs {names}) on {device} with {strategy!r}")
            return

        entries: list[tuple[GraphSpec, Backend]] = reused
        reports: list[TuneReport] = reused_reports
        failures: list[str] = []
        for spec in graphs:
            start = time.perf_counter()
            if spec.name in node._growth.due:
                node._growth.retuned(spec.name)
            try:
                report = strategy.tune_with_report(proxy, node.path, spec, samples[spec.name], device, cache_dir)
            except Exception as exc:
                cause = f"{type(exc).__name__}: {exc}"
                node._failed[spec.name] = cause
                decisions.remember_eager(keys.get(spec.name), node, spec, cause, reopen=True,
                                         persist=not isinstance(exc, NotFasterThanEagerError))
                failures.append(cause if len(graphs) == 1 else f"graph {spec.name}: {cause}")
                node._log(f"Tuning {node.short} failed after {time.perf_counter() - start:.2f}s: {cause}")
                _logger.debug("Tuning %s failed", node.path, exc_info=True)
                continue
            elapsed = time.perf_counter() - start
            speedup = report.speedup
            if strategy.measures_speed and speedup is not None and speedup < 1.0:
                _discard(report.backend)
                cause = f"no backend is faster than eager (best {report.backend.describe()}: {speedup:.2f}x)"
                node._failed[spec.name] = cause
                decisions.remember_eager(keys.get(spec.name), node, spec, cause, reopen=True, persist=False)
                failures.append(cause if len(graphs) == 1 else f"graph {spec.name}: {cause}")
                node._log(f"Tuning {node.short} took {elapsed:.2f}s: {cause}")
                continue
            entries.append((spec, report.backend))
            reports.append(report)
            decisions.remember_backend(keys.get(spec.name), node, spec, report)
            measured = f", {speedup:.2f}x faster than eager at recorded shapes" if speedup is not None else ""
            node._log(
                f"Tuning {node.short} took {elapsed:.2f}s: {report.backend.describe()} for graph {spec.name}{measured}"
            )
            _log_rejected(node, report)

    if entries:
        _apply(node, entries, reports)
    elif first and not abandoned():
        node.go_eager("; ".join(failures) or "nothing could be tuned")


def _apply(node: PatchedModule, entries: list[tuple[GraphSpec, Backend]], reports: list[TuneReport]) -> None:
    """Switch the node to its new backends, unless its background job was abandoned meanwhile or the hook is off."""
    if not entries:
        return
    if abandoned() or not is_installed():  # timed out, or JIT tuning was switched off while the job ran
        for _spec, backend in entries:
            _discard(backend)
        return
    sync_stream()  # on CUDA, what the worker's stream built is complete before any call uses it
    node.go_tuned(entries, reports)


def _log_rejected(node: PatchedModule, report: TuneReport) -> None:
    """The candidates that lost on correctness, with how close they came (the winner's line names only it)."""
    for candidate in report.candidates:
        closeness = getattr(candidate, "closeness", None)
        if candidate.error is not None and closeness:
            node._log(f"  rejected {candidate.description} for {node.short}: {closeness}")


def _discard(backend: Backend) -> None:
    try:
        if backend.is_active:
            backend.deactivate()
    except Exception:  # releasing must never hide the outcome
        _logger.debug("Could not deactivate %s", backend.describe(), exc_info=True)
