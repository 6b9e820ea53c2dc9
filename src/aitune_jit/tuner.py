"""Tuning one node: known decisions, graph-break check, strategy per ready graph; `tune(node)` returns the
`TuningOutcome` (tuned with backends / eager / descend to the children / dry run) that the node applies.

The tuner reads the node (`outcome.TuningNode`) and never changes it: the node applies the outcome itself
(`PatchedModule.apply`). Runs on the background worker's job thread (the node's `_tune_queued`) or, with
`jit_config.blocking`, in the thread whose call made a graph ready; under the root's lock, with the hook
bypassed for this thread (so nothing the strategy runs is recorded or adopted) and gradients off. Known
decisions (an identical module tuned before, in this process or a previous one) are applied first
(`decisions.py`); every new decision is published.

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
from aitune_core.errors import NotFasterThanEagerError, TuningFailedError, ValidationError
from aitune_core.log import get_logger
from aitune_core.module_info import module_device
from aitune_core.specs.range_headroom import with_headroom
from aitune_core.specs.replay_state import replaying
from aitune_core.strategies.tune_job import TuneJob
from aitune_core.torch_log_capture import capture_torch_logs
from aitune_jit import decisions, packaging, replica_claims
from aitune_jit.config import jit_config
from aitune_jit.graph_breaks import find_graph_breaks
from aitune_jit.held_warnings import held_warnings
from aitune_jit.node_registry import registry
from aitune_jit.outcome import OutcomeDraft, TuningOutcome, Verdict, release_backend
from aitune_jit.runtime import bypassed, is_installed
from aitune_jit.stale_samples import STALE, recorded_calls_stale
from aitune_jit.state import NodeState
from aitune_jit.tuning_budget import budget
from aitune_jit.worker import abandoned, sync_stream

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneReport
    from aitune_jit.outcome import TuningNode

_logger = logging.getLogger("aitune.jit")
_strategy_logger = get_logger("strategy")
_log = registry.log
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SIMPLE_OUTPUTS = (bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum, type)


class ForwardOnly(torch.nn.Module):
    """`module`'s forward alone (no hooks, no wrapper); `module` is a submodule, so its weights are visible."""

    def __init__(self, module: torch.nn.Module, forward: Callable[..., Any]) -> None:
        super().__init__()
        # (not `self.module = module`: torch's global module registration hooks would see aitune's wrapper)
        self._modules["module"] = module
        self.forward = forward  # the original (bound) forward: signature and behaviour of the user's module


def tune(node: TuningNode) -> TuningOutcome:
    """Tune every graph of `node` that has enough recordings (see the module docstring) and return the outcome,
    ready for the node to apply now (the caller holds the root's lock and applies it at once).

    What torch logs and warns while it probes and compiles goes into the node's history, not to the console.
    """
    spent = budget.exhausted()
    if spent is not None:
        spent_outcome = TuningOutcome.eager(spent, reopen=False)
        return _deliver(spent_outcome if node.state is NodeState.RECORDING else TuningOutcome.unchanged())
    start = time.perf_counter()
    with capture_torch_logs() as captured:
        try:
            outcome = _tune_node(node)
        finally:
            budget.charge(time.perf_counter() - start)
            if captured.lines:
                _log(f"While tuning {node.short}, {captured.summary()}", logging.DEBUG)
                for line in captured.lines:
                    _logger.debug("torch, while tuning %s: %s", node.path, line)
    return _deliver(outcome)


def _deliver(outcome: TuningOutcome) -> TuningOutcome:
    """The outcome as the node may apply it now: nothing of a job that was abandoned (timed out, or outlived the
    program), no backends once JIT tuning was switched off while the job ran; on CUDA, what the worker's stream
    built is complete before any call uses it."""
    if abandoned():
        outcome.release_backends()
        return TuningOutcome.unchanged()
    if outcome.verdict is Verdict.TUNED:
        if not is_installed():
            return outcome.without_backends()
        sync_stream()
    return outcome


def _uncomparable_output(samples: dict[str, list[Sample]]) -> str | None:
    """The first recorded output object validation could never accept (no `==` of its own, no tensors to compare
    its state by, and not one of the call's own argument objects): found before any compile, instead of after
    one."""
    from aitune_core.specs.tree import flatten
    from aitune_core.validation.private_inputs import argument_state
    from aitune_core.validation.tensor_slots import holds_tensors

    for graph_samples in samples.values():
        for sample in graph_samples[:1]:
            arguments = {id(obj) for obj in argument_state(sample.inputs_after).objects.values()} if (
                sample.inputs_after is not None) else set()
            for locator, leaf in flatten(sample.output)[0]:
                if isinstance(leaf, torch.Tensor) or leaf is None or isinstance(leaf, _SIMPLE_OUTPUTS):
                    continue
                if id(leaf) in arguments:  # a stateful call's cache, returned: validated as the state it left
                    continue
                if type(leaf).__eq__ is object.__eq__ and not holds_tensors(leaf):  # (a new cache: by its state)
                    where = f"output{locator}" if locator else "output"
                    return f"its {where} is a {type(leaf).__name__} object, which aitune cannot compare"
    return None


def _worthless(strategy: Any, job: TuneJob) -> str | None:
    """The strategy's cheap verdict (one torch.nn layer, an eager call too short to win back a dispatch) before
    any dynamo trace: such a node stays eager, and so do its children (they are cheaper still)."""
    check = getattr(strategy, "skip_reason", None)
    return check(job) if check is not None else None


def _hooked(module: torch.nn.Module) -> str | None:
    """Hooks on submodules (or global module hooks): no backend would run them, and probing the module would
    fire them with recorded inputs. Such a node is not tuned as a whole; its children are (docs/architecture.md,
    "Tuned modules follow the model")."""
    hooks = submodule_hooks(module)
    if not hooks:
        return None
    return f"{hooks} hook(s) are registered on its submodules (or globally); its submodules are tuned instead"


def _tune_node(node: TuningNode) -> TuningOutcome:
    cfg = jit_config
    cfg.validate()  # invalid options fail here at the latest, with the option's name
    module = node.module
    recorder = node.recorder
    graphs = [with_headroom(spec) if cfg.range_headroom else spec for spec in node.ready_graphs()]
    if module is not None and not graphs and node.package_due:  # nothing to tune: a package the node owes
        with bypassed(), torch.no_grad():
            return packaging.make_next(node, cfg.device or module_device(module, default=torch.device("cpu")))
    if module is None or recorder is None or not graphs:
        return TuningOutcome.unchanged()
    first = node.state is NodeState.RECORDING
    samples = {spec.name: recorder.samples(spec) for spec in graphs}
    device = cfg.device or module_device(module, samples[graphs[0].name], default=torch.device("cpu"))
    proxy = node.tuning_view()
    cache_dir = cfg.cache_dir / _UNSAFE.sub("_", node.path)
    hooked = _hooked(module)
    if hooked is not None:
        return TuningOutcome.eager(hooked, reopen=True) if first else TuningOutcome.unchanged()
    if first:
        uncomparable = _uncomparable_output(samples)
        if uncomparable is not None:
            return TuningOutcome.eager(uncomparable, reopen=True)

    draft = OutcomeDraft()
    decisions.point_inductor_cache()
    with bypassed(), torch.no_grad():
        strategy = cfg.resolve_strategy(device)
        keys = {} if cfg.dry_run else decisions.keys_for(node, graphs, strategy, device)
        replica_claims.back_to_waited(node, graphs, samples, keys, strategy, device)
        draft.upgraded.update(spec.name for spec in graphs if spec.name in node.upgrade_due)
        packaging.warm_starts(node, proxy, graphs, samples, keys, device, draft)
        outcome = _decide(node, strategy, graphs, samples, keys, device, cache_dir, first, draft)
    return packaging.owed(outcome, keys, device)


def _decide(
    node: TuningNode, strategy: Any, graphs: list[GraphSpec], samples: dict[str, list[Sample]], keys: dict[str, str],
    device: torch.device, cache_dir: Path, first: bool, draft: OutcomeDraft,
) -> TuningOutcome:
    """The known decisions, then, for the graphs left that no other process is tuning (`replica_claims`), the
    graph-break check and the strategy (see `_tune_node`)."""
    proxy = node.tuning_view()
    tried: set[str] = set()
    finished = decisions.reuse(node, proxy, graphs, samples, keys, device, cache_dir, first, draft, tried)
    if finished is not None:
        return finished
    claimed: list[str] = []
    try:
        claimed = replica_claims.claim_or_wait(node, graphs, keys, draft)  # (another process may tune some)
        first = first and not draft.waiting  # a node waiting for a graph stays as it is: its other graphs only fail
        if claimed:  # a decision stored between the lookup and the claim: reused, not tuned again
            finished = decisions.reuse(node, proxy, graphs, samples, keys, device, cache_dir, first, draft, tried)
            if finished is not None:
                return finished
        return _tune_unknown(node, strategy, graphs, samples, keys, device, cache_dir, first, draft)
    finally:
        replica_claims.release(node, claimed)


def _tune_unknown(
    node: TuningNode, strategy: Any, graphs: list[GraphSpec], samples: dict[str, list[Sample]], keys: dict[str, str],
    device: torch.device, cache_dir: Path, first: bool, draft: OutcomeDraft,
) -> TuningOutcome:
    """The graph-break check and the strategy for the graphs no decision was found for (see `_decide`)."""
    cfg = jit_config
    proxy = node.tuning_view()
    packaging.keep_packages(node, graphs)
    first = first and not draft.entries  # a node with a reused backend is tuned: its other graphs may only fail
    if not graphs:
        return draft.finish()
    jobs = {spec.name: TuneJob.of(proxy, node.path, spec, samples[spec.name], device, cache_dir) for spec in graphs}
    if first:
        worthless = _worthless(strategy, jobs[graphs[0].name])
        if worthless is not None:
            decisions.remember_eager(keys.get(graphs[0].name), node, graphs[0], worthless, reopen=False,
                                     persist=False)  # cheap to find again, and partly a timing
            return draft.eager(worthless, reopen=False)
    in_compile = cfg.detect_graph_breaks and not cfg.dry_run and _compile_finds_breaks(strategy)
    if cfg.detect_graph_breaks and not in_compile:
        for spec in [spec for spec in graphs if spec.name not in node.checked_graphs]:
            draft.checked.add(spec.name)
            cause = _graph_break_cause(node, proxy, spec, keys, samples, device)
            if cause is None:
                continue
            if first:
                return draft.eager(cause, reopen=True)
            draft.failed[spec.name] = cause
            graphs.remove(spec)
        if not graphs:
            return draft.finish()

    if cfg.dry_run:
        for spec in graphs:
            strategy.dry_run(jobs[spec.name])
        names = ", ".join(spec.name for spec in graphs)
        return TuningOutcome.dry_run(f"would tune {node.short} (graphs {names}) on {device} with {strategy!r}")

    failures = []
    for spec in graphs:
        failure, built = _tune_graph(node, strategy, jobs[spec.name], keys.get(spec.name), draft,
                                     several=len(graphs) > 1)
        if in_compile and spec.name not in node.checked_graphs:
            draft.checked.add(spec.name)
            cause = None if built else _graph_break_cause(node, proxy, spec, keys, samples, device)
            if built:
                _log(f"No graph breaks in {node.short}: its compile traced graph {spec.name} as one graph")
            if cause is not None and first:
                for _spec, backend in draft.entries:  # a graph tuned before this one: the node goes eager
                    release_backend(backend)
                draft.entries.clear()
                return draft.eager(cause, reopen=True)
            if cause is not None:
                draft.failed[spec.name] = cause
                failure = cause
        failures.append(failure)

    if draft.entries or not first:
        return draft.finish()
    reason = "; ".join(f for f in failures if f) or "nothing could be tuned"
    if draft.stale and len(draft.stale) == len(failures):  # every graph failed on outputs recorded before a change
        return draft.record_again(reason)
    return draft.eager(reason, reopen=True)


def _compile_finds_breaks(strategy: Any) -> bool:
    """Every candidate of `strategy` compiles the module as one graph or fails (the default strategy's Inductor
    candidates under `detect_graph_breaks`): a build that succeeds proves there is no graph break, so the
    separate check - a dynamo trace of its own, 6-16 s for ResNet-50 and BERT-base on an H100 - runs only after
    a graph's tuning failed, to say why."""
    backends = getattr(strategy, "backends", None)
    return bool(backends) and all(getattr(backend, "traces_whole_graph", False) for backend in backends)


def _graph_break_cause(
    node: TuningNode, proxy: torch.nn.Module, spec: GraphSpec, keys: dict[str, str],
    samples: dict[str, list[Sample]], device: torch.device,
) -> str | None:
    """Dynamo's explanation of one recorded call of graph `spec`: the cause when it breaks (logged and
    remembered as the graph's decision), else None."""
    args, kwargs = samples[spec.name][0].inputs_to(device)  # a stateful sample: on fresh copies
    with replaying(spec):  # traced as the program calls it
        report = find_graph_breaks(proxy, args, kwargs)
    if not report.has_breaks:
        _log(f"No graph breaks in {node.short}. Checking took {report.duration_s:.2f}s")
        return None
    what = "Dynamo could not trace" if report.error is not None else "Graph breaks in"
    _log(f"{what} {node.short} (graph {spec.name}): {report.summary()}. Checking took {report.duration_s:.2f}s")
    cause = report.summary() if report.error is not None else f"graph break: {report.summary()}"
    decisions.remember_eager(keys.get(spec.name), node, spec, cause, reopen=True)
    return cause


def _graph_break_failure(record: logging.LogRecord) -> bool:
    """A candidate's failure record (`aitune_failure`) whose cause is dynamo refusing to trace the forward as one
    graph (a graph break under `fullgraph`, data-dependent control flow): the graph-break check says why, once."""
    from torch._dynamo import exc as dynamo_exc

    exc = getattr(record, "aitune_failure", None)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (dynamo_exc.Unsupported, dynamo_exc.UserError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _tune_graph(
    node: TuningNode, strategy: Any, job: TuneJob, key: str | None, draft: OutcomeDraft, *, several: bool
) -> tuple[str | None, bool]:
    """Run the strategy on one graph: its backend joins the draft, or its failure is noted (and returned, for the
    node's reason when nothing could be tuned); and whether any candidate built."""
    spec = job.graph_spec
    start = time.perf_counter()
    if spec.name in node.retune_due:
        draft.retuned.add(spec.name)
    stale = False
    try:
        with held_warnings(_strategy_logger) as held:  # (a candidate's failure may be the stale samples', below)
            try:
                report = strategy.run(job)
            except Exception as exc:  # (no candidate won: the summary's line for the node says why, once)
                stale = _validation_failed(exc) and recorded_calls_stale(job)
                held.demote()
                raise
            held.demote(_graph_break_failure)
    except Exception as exc:
        cause = f"{type(exc).__name__}: {exc}"
        if stale:
            cause = f"{cause}; {STALE}"
            draft.stale.add(spec.name)
        else:
            decisions.remember_eager(key, node, spec, cause, reopen=True,
                                     persist=not isinstance(exc, NotFasterThanEagerError))
        draft.failed[spec.name] = cause
        _log(f"Tuning {node.short} failed after {time.perf_counter() - start:.2f}s: {cause}")
        _logger.debug("Tuning %s failed", node.path, exc_info=True)
        built = any(candidate.built for candidate in getattr(exc, "candidates", None) or ())
        return (f"graph {spec.name}: {cause}" if several else cause), built
    elapsed = time.perf_counter() - start
    speedup = report.speedup
    if strategy.measures_speed and speedup is not None and speedup < 1.0:
        release_backend(report.backend)
        cause = f"no backend is faster than eager (best {report.backend.describe()}: {speedup:.2f}x)"
        draft.failed[spec.name] = cause
        decisions.remember_eager(key, node, spec, cause, reopen=True, persist=False)
        _log(f"Tuning {node.short} took {elapsed:.2f}s: {cause}")
        return (f"graph {spec.name}: {cause}" if several else cause), True
    draft.entries.append((spec, report.backend))
    draft.reports.append(report)
    decisions.remember_backend(key, node, spec, report)
    measured = f", {speedup:.2f}x faster than eager at recorded shapes" if speedup is not None else ""
    _log(f"Tuning {node.short} took {elapsed:.2f}s: {report.backend.describe()} for graph {spec.name}{measured}")
    regions = getattr(report.backend, "regions_summary", None)
    if regions:
        _log(f"  {node.short}: identical blocks compiled once per class as nested compile regions ({regions})")
    _log_rejected(node, report)
    return None, True


def _validation_failed(exc: BaseException) -> bool:
    """Some candidate built and then failed validation (what recorded calls that went stale cause); a known
    decision's backend that failed its validation raises the ValidationError itself."""
    return isinstance(exc, ValidationError) or (isinstance(exc, TuningFailedError) and any(
        ValidationError.__name__ in (getattr(candidate, "error", None) or "")
        for candidate in getattr(exc, "candidates", None) or ()))


def _log_rejected(node: TuningNode, report: TuneReport) -> None:
    """The candidates that lost on correctness, with how close they came (the winner's line names only it)."""
    for candidate in report.candidates:
        closeness = getattr(candidate, "closeness", None)
        if candidate.error is not None and closeness:
            _log(f"  rejected {candidate.description} for {node.short}: {closeness}")

