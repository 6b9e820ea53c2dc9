"""`NodeTransitions`: how a JIT node asks for tuning and applies the outcome (a mixin of `PatchedModule`).

Why a file of its own: this is the one place where a node changes state after it started. The tuner
(`tuner.tune`) only reads the node and returns a `TuningOutcome`; `apply` takes it in one step through one
verdict -> handler table (`_APPLY`), and every state that gives up the forward wrapper goes through the one
clean-up `_drop_forward`.

Threads: with background tuning, `_try_tune` (on the calling thread) marks the node `_tuning` - its calls then
run the original forward and are still recorded (the recorder hands the worker snapshots: lists of specs and
samples that later calls do not change), but change nothing else about the node - and queues it;
`_tune_queued` runs on the worker's job thread under the root's lock, computes the outcome and applies it
between two calls: `_go_tuned` assigns the dispatcher before the state, so a concurrent call sees the old node or
the new one. With `jit_config.blocking`, the call that made a graph ready does the same in its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from aitune_core.backends.module_watch import submodule_hooks
from aitune_jit import device_guard_pin, fork_safety, replica_claims, signal_passthrough, summary, tuner, worker
from aitune_jit.compile_exclusion import excluding_compiles
from aitune_jit.config import jit_config
from aitune_jit.follow_ups import FollowUps
from aitune_jit.node_recording import missing_for_tuning
from aitune_jit.outcome import TuningOutcome, Verdict, release_backend
from aitune_jit.range_growth import MAX_RETUNES, RangeGrowth
from aitune_jit.runtime import bypassed, is_installed
from aitune_jit.stale_samples import STALE
from aitune_jit.state import NodeState

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneReport


#: tunings a node gets again after its backends stopped fitting the module (`_backends_outdated`) before it stays eager
RETUNES_AFTER_CHANGES = 4


class NodeTransitions:
    """Tuning requests and transitions of `PatchedModule` (its attributes are the node's; see
    `patched_module.py`)."""

    __slots__ = ()

    # ------------------------------------------------------------------------------------------ asking for tuning
    def _try_tune(self) -> None:
        """A graph is ready (`_record` set `_pending`): queue the node for the background worker, or, with
        `jit_config.blocking`, tune it now in this thread (unless another thread tunes a module of its root: then a
        later call tries again)."""
        if not jit_config.blocking:  # the call that made a graph ready never waits
            if not self._tuning:
                self._tuning, self._pending = True, False
                self._note_hooks()
                fork_safety.install()  # (a fork while the worker compiles must not hand the child its locks)
                worker.submit(self, NodeTransitions._tune_queued)
            return
        lock = self._tune_lock
        if not lock.acquire(blocking=False):
            return
        interrupted: signal_passthrough.HandlerRaised | None = None
        try:
            if not self._pending or self._tuning:
                return
            self._pending = False
            self._tuning = True
            self._note_hooks()
            self._release_retired()
            device_guard_pin.pin()  # (this thread may end before the program: see device_guard_pin)
            try:
                with signal_passthrough.passing_through():
                    self.apply(tuner.tune(self))
            except signal_passthrough.HandlerRaised as raised:  # the program's own exception: it gets it
                interrupted = raised
                self.give_up(f"tuning was interrupted by the program's signal handler (signal {raised.signum}, "
                             f"{type(raised.exc).__name__})")
            except Exception as exc:  # a strategy, backend or aitune bug: the program carries on eagerly
                self._internal_error("tuning", exc)
            finally:
                self._tuning = False
        finally:
            lock.release()
        if interrupted is not None:
            raise interrupted  # (the caller raises the program's exception: `NodeRecording._recorded_call`)

    def _note_hooks(self) -> None:
        """The submodule hooks as tuning begins: the watch of the backends it builds compares (`ModuleWatch`)."""
        module = self.module
        self._hooks_at_tune = submodule_hooks(module) if module is not None else None

    def _tune_queued(self) -> None:
        """The worker's job for this node (on its job thread): tune under the root's lock and apply the outcome; the
        node records again afterwards."""
        lock = self._tune_lock
        timeout = jit_config.tuning_timeout_s
        if not lock.acquire(timeout=-1 if timeout is None else timeout):  # a blocking-mode tuning of the root hangs
            self._tuning = False
            return
        owed = self._follow.snapshot()
        try:
            self._pending = False
            self._release_retired()
            try:
                with bypassed(), torch.no_grad():  # this thread's module calls are aitune's own
                    self.apply(tuner.tune(self))
            except Exception as exc:  # a strategy, backend or aitune bug: the program carries on eagerly
                self._follow.clear()
                if not worker.abandoned():
                    if self._recorded_calls_fail():  # (the program converted the module meanwhile: `.double()`)
                        self._record_again(f"its recorded calls fail on it now ({type(exc).__name__}: {exc})")
                    else:
                        self._internal_error("tuning", exc)
        finally:
            if owed and self._follow.snapshot() == owed:  # owed before and settled nothing: it never will
                self._follow.clear()
            again = (self._follow.pending() and not worker.abandoned() and self.state is NodeState.TUNED
                     and is_installed())
            if not again:
                self._follow.clear()
            self._tuning = False  # while follow-ups wait, calls record and ranges grow as after any job
            lock.release()
        if again:  # what the outcome owes (`follow_ups.py`) is a job of its own, queued behind the others
            worker.submit(self, NodeTransitions._tune_queued)

    def reopen_after_fork(self) -> None:
        """In a forked child, for a node whose job was queued or running in the parent (`fork_safety`): no job runs
        here, so its calls record again; and a tuning lock the parent's job thread held is held by no thread here,
        so its root's nodes get a fresh one."""
        self._tuning = False
        lock = self._tune_lock
        if lock.acquire(blocking=False):
            lock.release()
            return
        fresh = threading.Lock()
        root = self
        while root.parent is not None:
            root = root.parent
        for node in root.subtree():
            node._tune_lock = fresh

    def give_up(self, reason: str) -> None:
        """A tuning that did not finish (timed out, interrupted): a tuned node keeps what it serves and its graphs
        being tuned run eagerly; any other node stays eager."""
        replica_claims.release_for(self)  # (what the job still builds is never stored)
        if self.state is NodeState.TUNED:
            self.apply(TuningOutcome.unchanged(
                failed=MappingProxyType({spec.name: reason for spec in self.ready_graphs()}),
                packaged=frozenset(self.package_due), upgraded=self.upgrade_due))
        else:
            self.apply(TuningOutcome.eager(reason, reopen=False, level=logging.WARNING))

    def job_dropped(self) -> None:
        """The worker will not run, or not finish, this node's job: its calls record again."""
        self._tuning = False

    # ------------------------------------------------------------------------------------------ what tuning reads
    def ready_graphs(self) -> list[GraphSpec]:
        """The recorded graphs to tune now: enough samples (and a batch axis where required), neither tuned (unless
        due for re-tuning over wider ranges) nor failed, nor left to another process's tuning until the next look."""
        recorder = self._recorder
        if recorder is None:
            return []
        now = time.monotonic()
        waiting = {name for name, due in self._waits.items() if due > now}  # (another process tunes them)
        done = ({spec.name for spec, _backend in self._entries} - self._growth.due - self._follow.upgrade) | set(
            self._failed) | waiting
        return [spec for spec in recorder.graph_specs if spec.name not in done and missing_for_tuning(
            recorder, spec, varying_waits=not self._stateful and spec.name not in self._growth.due) is None]

    def tuning_view(self) -> torch.nn.Module:
        """The `ForwardOnly` view of the module that strategies and backends get (made once per node)."""
        if self._proxy is None:
            self._proxy = tuner.ForwardOnly(self.module, self._forward_fn)  # type: ignore[arg-type]
        return self._proxy

    @property
    def retune_due(self) -> frozenset[str]:
        """Tuned graphs whose calls fell outside their ranges often enough to be tuned again (`range_growth.py`)."""
        return frozenset(self._growth.due)

    @property
    def checked_graphs(self) -> frozenset[str]:
        """Graphs whose graph-break check ran (it runs once per graph)."""
        return frozenset(self._checked_graphs)

    @property
    def upgrade_due(self) -> frozenset[str]:
        """Graphs a warm-start package serves, to be built with their decided backend (`follow_ups.py`)."""
        return frozenset(self._follow.upgrade)

    @property
    def package_due(self) -> Mapping[str, tuple[str, GraphSpec]]:
        """Graphs that owe a warm-start package (`packaging.py`): name -> (decision key, the spec their backend
        serves)."""
        return MappingProxyType(dict(self._follow.package))

    @property
    def packaging_only(self) -> bool:
        """All this node still owes the worker is packages (it is then taken after every node that tunes)."""
        return bool(self._follow.package) and not self.ready_graphs()

    # ------------------------------------------------------------------------------------------ applying an outcome
    def apply(self, outcome: TuningOutcome) -> None:
        """Take a tuning outcome in one step: note its failed graphs, re-tunes and graph-break checks, then switch
        as its verdict says (`_APPLY`), never during another thread's dynamo compile (`compile_exclusion`)."""
        with excluding_compiles():
            if self._changed is not None:  # the program replaced the forward meanwhile: the outcome tuned the old one
                outcome.release_backends()
                return
            self._failed.update(outcome.failed)
            for name in outcome.retuned:
                self._growth.retuned(name)
            self._checked_graphs.update(outcome.checked)
            self._note_waits(outcome)
            self._follow.note(outcome)
            _APPLY[outcome.verdict](self, outcome)
            if self.state is NodeState.TUNED and any(STALE in cause for cause in outcome.failed.values()):
                self._record_anew("its recorded calls no longer match the module (the program changed what it "
                                  "computes: a global, an attribute, a config value)")
            if self.state is not NodeState.TUNED:
                self._follow.clear()  # nothing tuned is left to package or upgrade

    def _note_waits(self, outcome: TuningOutcome) -> None:
        """Graphs another process is tuning (`replica_claims`): their calls run the original module and are
        recorded; the first recorded call after `POLL_S` seconds queues the node to look for the decision again.
        The graph as it was when the wait began is kept (`waited_specs`): the calls recorded meanwhile may widen
        its ranges, and the decision looked for is that of the graph the other process tunes."""
        for name in [spec.name for spec, _backend in outcome.entries] + list(outcome.failed):
            self._waited.pop(name, None)
        for name, (holder, spec) in outcome.waiting.items():
            self._waits[name] = time.monotonic() + replica_claims.POLL_S
            self._waited.setdefault(name, spec)
            self._note_once(f"wait-{name}", f"{self.short} graph {name}: {holder} is tuning it with the same cache "
                            "folder; its calls run the original module here until that decision is stored (looked "
                            f"for every {replica_claims.POLL_S:g}s)")

    @property
    def waited_specs(self) -> Mapping[str, GraphSpec]:
        """Graphs this node waited for another process to tune, as they were when the wait began."""
        return MappingProxyType(dict(self._waited))

    @property
    def waiting_on_others(self) -> bool:
        """Whether, at its last look, a graph of this node was being tuned by another process (`replica_claims`)."""
        return bool(self._waits)

    def _wait_over(self, name: str) -> bool:
        """True once, when graph `name`, left to another process's tuning, is due for another look."""
        due = self._waits.get(name)
        if due is None or time.monotonic() < due:
            return False
        del self._waits[name]
        return True

    def _go_tuned(self, entries: list[tuple[GraphSpec, Backend]], reports: list[TuneReport]) -> None:
        """Route calls of these graphs through their backends; detach the subtree on the first success."""
        names = {spec.name for spec, _backend in entries}
        replaced = [backend for spec, backend in self._entries if spec.name in names]  # re-tuned graphs
        self._entries = [entry for entry in self._entries if entry[0].name not in names] + list(entries)
        for backend in replaced:
            release_backend(backend)
        self.reports.extend(reports)
        self._dispatcher = self._new_dispatcher()  # complete before the state says TUNED
        if self.state is not NodeState.TUNED:
            self.state = NodeState.TUNED
            self.reason = None
            self.fast = True
            self._detach_subtree()
        self._record_tuned()

    def _record_tuned(self) -> None:
        summary.record_tuned(self, [backend.describe() for backend in self.backends], self.speedup)

    def _go_eager(self, reason: str, *, reopen: bool = True, level: int = logging.INFO) -> None:
        """Run the original forward from now on; the children become candidates (when `reopen`)."""
        self._drop_forward()
        self.reason = reason
        self.descend = reopen
        self.state = NodeState.EAGER
        self._log(f"{self.short} stays eager: {reason}", level)
        summary.forget(self)
        if reopen and self.is_open:
            self._open_children()
        elif not reopen:
            self._close_children()

    def _record_again(self, reason: str) -> None:
        """The module changed while its first tuning ran (`stale_samples`): forget what was recorded and record its
        calls anew, once; a second time it stays eager (its children are tuned), as any failed tuning does."""
        if self.state is not NodeState.RECORDING or self._recorded_again or self.module is None:
            self._go_eager(reason, reopen=True)
            return
        from aitune_core.recording.graph_recorder import GraphRecorder

        self._recorded_again = True
        self._recorder = GraphRecorder(self._forward_fn, name=self.path)  # type: ignore[arg-type]
        self._log(f"{self.short}: recording its calls again, the module changed while it was tuned ({reason})")

    def _backends_outdated(self, what: str) -> bool:
        """The dispatcher's news that the module's structure changed (`ModuleWatch`: `.to(torch.bfloat16)`,
        `.cuda()`, a submodule of another class): its backends were made for the old one and the original module
        answers. The node records its calls anew (`_record_anew`). Returns False, to be asked again at the next
        call, while a job of its root runs or another thread compiles: taken between two calls, as an outcome."""
        if self.state is not NodeState.TUNED or self._tuning or self.module is None:
            return False
        lock = self._tune_lock
        if not lock.acquire(blocking=False):
            return False
        try:
            with excluding_compiles(wait_s=0) as alone:
                if not alone or self.state is not NodeState.TUNED:
                    return False
                self._record_anew(f"{what} since it was tuned")
                return True
        finally:
            lock.release()

    def _code_missed(self, name: str) -> bool:
        """The dispatcher's news that a call of graph `name` missed its compiled code (dynamo's guards failed,
        `run_only.py`) and the original forward answered it. Counted with the calls outside the graph's ranges
        (`range_growth`): after `jit_config.retune_after_misses` of them the graph is tuned again in the
        background, the compiled graph serving what still fits meanwhile. Where the program changed what the module
        computes (a global, an attribute), that tuning finds the recorded calls stale and the node records anew.
        Returns False once the graph's re-tunings are spent (an input layout no recorded call had, which no
        re-tuning compiles): its backend then compiles inside the call, as torch.compile does."""
        if self.state is not NodeState.TUNED or not any(s.name == name for s, _ in self._entries):
            return True
        if self._growth.retunes.get(name, 0) >= MAX_RETUNES and name not in self._growth.due:
            self._note_once(f"compiles-{name}", f"{self.short}: calls of graph {name} still miss its compiled code "
                            f"after {MAX_RETUNES} tunings; its backend compiles them inside the call from now on")
            return False
        if not self._tuning and self._growth.missed(name, code=True):
            self._log(f"{self.short}: {jit_config.retune_after_misses} calls of graph {name} missed its compiled "
                      "code (dynamo's guards failed: a global, an attribute, a config value or an input layout it "
                      "was traced with changed) and ran the original forward; tuning it again")
            self._pending = True
            self._try_tune()
        return True

    def _record_anew(self, why: str) -> None:
        """Forget the tunings and record the module's calls anew, to be tuned as it is now, in the background (the
        decision key holds the dtypes: a return to an old structure finds its decision in the JIT cache); after
        `RETUNES_AFTER_CHANGES` such starts it stays eager."""
        self._retunes += 1
        if self._retunes > RETUNES_AFTER_CHANGES:
            retired = self._retired + [backend for _spec, backend in self._entries]
            self._entries, self._retired = [], []
            # (released on a side thread: a release collects garbage, and this may be a request's thread)
            worker.start_side_job("release", lambda: [release_backend(backend) for backend in retired])
            self._go_eager(f"{why}, after {RETUNES_AFTER_CHANGES} tunings for such changes already; it runs eagerly "
                           "from now on", reopen=False, level=logging.WARNING)
            return
        self._forget_tuning()
        self._log(f"{self.short}: {why}; the original module answers, and its calls are recorded to tune it again")

    def _forget_tuning(self) -> None:
        """Back to RECORDING with nothing of the tunings before (`_backends_outdated`); the subtree stays detached."""
        from aitune_core.recording.graph_recorder import GraphRecorder

        entries, self._entries = self._entries, []
        self._dispatcher = None  # (a concurrent call that still sees TUNED runs the plain forward: `_dispatch`)
        # released by its next tuning (`_release_retired`), not on the caller's thread: a release collects garbage
        # (0.3 s for a small BERT on this CPU), which a job does with the program's objects frozen (worker_courtesy)
        self._retired.extend(backend for _spec, backend in entries)
        self.reports = []
        self._failed.clear()
        self._checked_graphs.clear()
        self._growth = RangeGrowth()
        self._follow = FollowUps()
        self._waits.clear()
        self._waited.clear()
        self._recorder = GraphRecorder(self._forward_fn, name=self.path)  # type: ignore[arg-type]
        self._recorded_again = False  # (a new structure: a change while its next tuning runs is news again)
        self.state = NodeState.RECORDING
        self.fast = False
        summary.forget(self)

    def _release_retired(self) -> None:
        """Release the backends `_forget_tuning` took out of service (on the thread that tunes the node next)."""
        retired, self._retired = self._retired, []
        for backend in retired:
            release_backend(backend)

    def _recorded_calls_fail(self) -> bool:
        """Whether the module's own forward now raises on its first recorded call. A job that failed that way met
        a module the program changed after recording it (converted to float64 while its job was queued), not an
        aitune bug: it records again instead of going eager with a warning."""
        recorder = self._recorder
        try:
            specs = recorder.graph_specs if recorder is not None else []
            samples = recorder.samples(specs[0]) if specs else []
            if not samples:
                return False
            args, kwargs = samples[0].inputs_to(None)
            with bypassed(), torch.no_grad():
                self._forward_fn(*args, **kwargs)  # type: ignore[misc]
        except Exception:
            return True
        return False

    def _go_dry_run(self, message: str) -> None:
        """Dry run: log what tuning would do, keep the module as it is, and treat the subtree as covered."""
        self._drop_forward()
        self.reason = f"dry run: {message}"
        self.descend = False
        self.state = NodeState.SKIPPED
        self.fast = True
        self._log(f"Dry run: {message}")
        self._detach_subtree()

    def _detach(self) -> None:
        self._drop_forward(keep_dispatcher=True)
        self.state = NodeState.DETACHED
        self.fast = True

    def _release(self) -> None:
        """Give the module back untouched (hook switched off)."""
        self._drop_forward()
        self._entries = []
        self._retired = []
        self.fast = True

    def _drop_forward(self, *, keep_dispatcher: bool = False) -> None:
        """The one clean-up of every state without a forward wrapper (EAGER, dry-run SKIPPED, DETACHED, released):
        the wrapper goes, and with it what recording and tuning kept."""
        self._uninstall_forward()
        self._recorder = None
        self._proxy = None
        self._pending = False
        self._waits.clear()  # (nothing is recorded or tuned any more: nothing waits)
        self._waited.clear()
        if not keep_dispatcher:
            self._dispatcher = None

    def _open_children(self) -> None:
        for child in list(self.children):
            if child.state is NodeState.INIT and child._started:
                child._become_candidate()
                self._log(f"Recording child module: {child}")
            elif child.state is NodeState.SKIPPED and child.descend:
                child._open_children()

    def _close_children(self) -> None:
        """Children waiting for this node (INIT) will never be candidates: on the fast path, like a tuned node's
        subtree (otherwise they, and so this node and its ancestors, would take the hook's slow path forever)."""
        for node in list(self.subtree())[1:]:
            if node.state is NodeState.INIT:
                node._detach()

    def _detach_subtree(self) -> None:
        for node in list(self.subtree())[1:]:
            if node.state is not NodeState.DETACHED:
                node._detach()
                self._log(f"Unpatching child module: {node}")


#: verdict -> how the node takes it (see `outcome.py`)
_APPLY: dict[Verdict, Callable[[NodeTransitions, TuningOutcome], None]] = {
    Verdict.TUNED: lambda node, outcome: node._go_tuned(list(outcome.entries), list(outcome.reports)),
    Verdict.EAGER: lambda node, outcome: node._go_eager(str(outcome.reason), reopen=False, level=outcome.level),
    Verdict.DESCEND: lambda node, outcome: node._go_eager(str(outcome.reason), reopen=True, level=outcome.level),
    Verdict.DRY_RUN: lambda node, outcome: node._go_dry_run(str(outcome.reason)),
    Verdict.UNCHANGED: lambda node, outcome: None,
    Verdict.RECORD_AGAIN: lambda node, outcome: node._record_again(str(outcome.reason)),
}
