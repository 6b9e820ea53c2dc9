"""`NodeRecording`: how a JIT node records its module's calls (a mixin of `PatchedModule`).

Why a file of its own: recording is the part of a node that must never change what the program computes, and
the most subtle one - calls are recorded as the forward received them (`ArgumentWatch`), only inference calls are
recorded, and any failure inside aitune while recording ends the node's tuning instead of the user's call.

A forward that changes its arguments (a decoder appending to the KV cache the caller passed) makes the node
*stateful* (`jit_config.stateful_calls`): the call that shows it is not recorded (its arguments were not copied
before it ran), and every later recorded call first copies its arguments (`owned_inputs`) and then records the
copy with the state the forward left behind (`GraphRecorder.record(after=...)`), so tuning replays the call as it
was and validation compares what a backend leaves in the arguments. Without the option, or when the arguments
cannot be copied, the node is not replayable and stays eager. The node's state, transitions and dispatch live in
`patched_module.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.dispatcher import functorch_transforms_active
from aitune_core.errors import NotReplayableError
from aitune_core.recording.argument_watch import ArgumentWatch
from aitune_core.recording.module_effects import ModuleEffects
from aitune_core.recording.outside_effects import OutsideEffects
from aitune_core.recording.sample import owned_inputs
from aitune_core.validation.tensor_slots import tensor_slots
from aitune_jit import reparametrized
from aitune_jit.config import jit_config
from aitune_jit.signal_passthrough import HandlerRaised
from aitune_jit.state import NodeState
from aitune_jit.torch_call_site import call_forward

if TYPE_CHECKING:
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_core.specs.graph_spec import GraphSpec

_logger = logging.getLogger("aitune.jit")


class NodeRecording:
    """Recording half of `PatchedModule` (its attributes are the node's; see `patched_module.py`)."""

    __slots__ = ()

    def _recorded_call(self, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run the original forward and record the call: inputs as they were before it ran, and whether it
        changed them (a forward that changes its arguments cannot be replayed for tuning)."""
        if self._tuning and self._seen_enough(args, kwargs):  # during its job only new graphs are recorded
            return call_forward(forward, args, kwargs)
        watch = self._watch(args, kwargs)
        before = self._copy_before(args, kwargs) if self._stateful else None
        effects = self._effects()
        try:
            output = call_forward(forward, args, kwargs)  # (warnings name torch's line, as plainly)
        except BaseException:
            for effect in effects:
                effect.abandon()
            raise
        interrupted: BaseException | None = None
        try:
            changes = [effect.changes() for effect in effects]  # (every watch ends, whichever saw a change)
            changed = next((change for change in changes if change is not None), None)
            if changed is not None:
                self._effects_changed(changed)
                return output  # (a call that changed the module is not replayed)
            self._record(args, kwargs, output, watch, before)
            if self._pending:
                self._try_tune()
        except Exception as exc:  # aitune's own failure: never the user's call
            self._internal_error("recording", exc)
        except HandlerRaised as raised:  # a blocking tune interrupted by the program's signal handler
            interrupted = raised.exc
        if interrupted is not None:
            raise interrupted  # (outside the handlers above: its context stays what the program had)
        return output

    def _missed_call(self, graph: str, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A call of tuned graph `graph` whose compiled code's guards failed runs here (the dispatcher's
        `on_plain_run`): the original forward, recorded and kept whatever its shapes (`RangeGrowth.keep_missed`), so
        the re-tune its misses lead to compiles its input layout too. Seen with GPT-2's `generate()`: the first
        decoding step after a compiled prefill gets the cache in the prefill graph's output strides, which the decode
        graph, recorded while the prefill ran eagerly, never saw; every `generate()` missed once, and re-tunes on
        the old samples missed again."""
        if self._tuning or self._recorder is None or not self._growth.keep_missed(graph):
            return call_forward(forward, args, kwargs)
        watch = self._watch(args, kwargs)
        before = self._copy_before(args, kwargs) if self._stateful else None
        output = call_forward(forward, args, kwargs)
        try:
            self._record(args, kwargs, output, watch, before, keep=True)
        except Exception as exc:  # aitune's own failure: never the user's call
            self._internal_error("recording", exc)
        return output

    def _watch(self, args: tuple, kwargs: dict) -> ArgumentWatch | None:
        try:
            recorder = self._recorder
            names = recorder.binder.positional if recorder is not None else ()
            return ArgumentWatch.before(args, kwargs, names)
        except Exception as exc:
            _logger.debug("%s: cannot watch the arguments of this call (%r)", self.path, exc)
            return None

    def _effects(self) -> tuple[ModuleEffects | OutsideEffects, ...]:
        """Fingerprints of the module, the random streams (`ModuleEffects`) and what lies outside the module
        (`OutsideEffects`: globals, class attributes, printing and logging) before this call; none on the node's
        first call: a forward may set up caches of its own then (a lazily built table, a warning logged once),
        which later calls, and replays, leave as they are."""
        recorder, module = self._recorder, self.module
        if recorder is None or module is None or recorder.total_calls == 0:
            return ()
        try:
            inside = ModuleEffects.before(module)
        except Exception as exc:
            _logger.debug("%s: cannot fingerprint the module before this call (%r)", self.path, exc)
            return ()
        try:
            return (inside, OutsideEffects.before(module))
        except Exception as exc:
            _logger.debug("%s: cannot fingerprint what lies outside the module before this call (%r)", self.path,
                          exc)
            return (inside,)

    def _effects_changed(self, changed: str) -> None:
        """A recorded call changed the module, drew random numbers (`ModuleEffects`), or changed something outside
        the module (`OutsideEffects`). The second such call makes the node not replayable; one alone may be another
        thread of the program drawing (or printing) at the same moment."""
        if self._effects_seen is None:
            self._effects_seen = changed
            _logger.debug("%s: a recorded call %s; not recorded", self.path, changed)
        elif not self._tuning:
            self._not_replayable(f"its forward {changed}, so replaying its calls for tuning would change what the "
                                 "program computes")

    def _seen_enough(self, args: tuple, kwargs: dict) -> bool:
        """The call's graph has `min_samples` recordings already: while the worker tunes the node, such calls are
        not recorded (no watch, no copy of a stateful call's cache on the serving thread)."""
        recorder = self._recorder
        try:
            return recorder is not None and recorder.recorded_at_least(args, kwargs, jit_config.min_samples)
        except Exception:
            return False

    def _copy_before(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | Exception | None:
        """A stateful node's copy of the arguments before its forward changes them (None when this call will not
        be recorded; the exception when they cannot be copied, handled after the call)."""
        if self._recorder is None:
            return None
        too_large = state_too_large(args, kwargs)
        if too_large is not None:
            return NotReplayableError(too_large)
        try:
            return owned_inputs(args, kwargs)
        except NotReplayableError as exc:
            return exc
        except Exception as exc:
            _logger.debug("%s: cannot copy the arguments of this call", self.path, exc_info=True)
            return NotReplayableError(f"its arguments cannot be copied ({type(exc).__name__}: {exc})")

    def _internal_error(self, stage: str, exc: Exception) -> None:
        """A bug or an unexpected failure inside aitune while `stage` ran: the node stops being tuned (its calls run
        the original module), with the reason in the history and one WARNING."""
        _logger.debug("aitune failed while %s %s", stage, self.path, exc_info=True)
        if self._changed is not None:  # a job that lost its node to a replaced forward (`_forward_changed`): quiet
            return
        reason = f"aitune failed while {stage} it ({type(exc).__name__}: {exc})"
        try:
            tuned = self.state is NodeState.TUNED
            if tuned:
                self._entries = []
                self._dispatcher = None
            self._go_eager(reason, reopen=not tuned, level=logging.WARNING)
        except Exception:  # pragma: no cover - the last line of defence must not raise either
            _logger.debug("could not send %s to eager", self.path, exc_info=True)

    def _recordable(self, args: tuple, kwargs: dict) -> bool:
        """Only inference calls are recorded and dispatched: eval mode, no autograd graph to preserve, and no
        `torch.func` transform around the call."""
        module = self.module
        if module is None:
            return False
        if functorch_transforms_active():  # (recorded, a vmap's per-example shapes became samples and ranges)
            self._note_once(
                "functorch",
                f"{self.short} is called under a torch.func transform (vmap, grad, jacrev): those calls run eagerly "
                "and are not recorded",
            )
            return False
        if reparametrized.swapped(module):  # (recorded, its output came from the call's weights, not the module's)
            self._note_once(
                "functional_call",
                f"{self.short} is called through torch.func.functional_call: those calls run eagerly and are "
                "not recorded",
            )
            return False
        if module.training:
            self._note_once(
                "training",
                f"{self.short} is in training mode: its calls run eagerly and are not recorded (use .eval())",
            )
            return False
        if torch.is_grad_enabled() and (
            self._trainable
            or self._unfrozen(module)
            or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
            or any(isinstance(v, torch.Tensor) and v.requires_grad for v in kwargs.values())
        ):
            self._note_once(
                "grad",
                f"{self.short} is called with gradients enabled: those calls run eagerly and are not recorded "
                "(use torch.no_grad() or torch.inference_mode())",
            )
            return False
        return True

    def _unfrozen(self, module: torch.nn.Module) -> bool:
        """Whether a module that had no trainable parameters when it was adopted has some now (the program
        unfroze it: `requires_grad_(True)`); its grad-enabled calls then run eagerly. Asked only of calls made with
        gradients enabled."""
        if any(p.requires_grad for p in module.parameters()):
            self._trainable = True
        return self._trainable

    def _record(
        self,
        args: tuple,
        kwargs: dict,
        output: Any,
        watch: ArgumentWatch | None = None,
        before: tuple[tuple, dict] | Exception | None = None,
        *,
        keep: bool = False,
    ) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        # While the worker tunes this node, calls are still recorded (a graph first seen now - a prefill length, a
        # batch size - is ready when the job ends, instead of being recorded only after it), but nothing else
        # about the node changes: no transition, no re-tune count; the worker reads a snapshot of the recorder.
        tuning = self._tuning
        after = None
        if watch is not None:
            changed = watch.changes()
            if changed is not None and not isinstance(before, tuple):
                if not tuning:
                    self._become_stateful(changed, before if before is not None else state_too_large(args, kwargs))
                return
            if changed is not None:
                after = (args, kwargs)  # the caller's containers and objects, as the forward left them
                args, kwargs = before  # type: ignore[misc]
            else:
                args, kwargs = watch.args, watch.kwargs  # as the forward received them
        try:
            spec = recorder.record(args, kwargs, output, after=after, keep=keep)
        except Exception as exc:
            reason = f"its calls cannot be recorded ({type(exc).__name__}: {exc})"
            _logger.debug("Recording %s failed", self.path, exc_info=True)
            if tuning:
                return
            if self.state is NodeState.RECORDING:
                self._go_eager(reason)
            else:
                self._recorder = None
                self._note_once("record", f"{self.short}: new graphs are not tuned: {reason}", logging.WARNING)
            return
        if spec is None:  # beyond config.max_num_graphs: the recorder warned once
            return
        if self._stateful and _never_repeats(recorder):
            if tuning:
                return
            self._not_replayable(f"{self._stateful}, and the state it changes has a new layout on every call "
                                 f"({recorder.total_calls} calls, each a graph of its own)")
            return
        name = spec.name
        if name in self._failed:
            return
        if any(s.name == name for s, _ in self._entries):  # a tuned graph's call outside its ranges
            if keep:
                return  # (a call that missed the compiled code: `_code_missed` counts it)
            if not tuning and self._growth.missed(name):
                self._log(f"{self.short}: {jit_config.retune_after_misses} calls of graph {name} fell outside its "
                          f"tuned ranges; tuning it again over {_ranges(spec)}")
                self._pending = True
            elif not tuning and name in self._growth.due and self._wait_over(name):
                self._pending = True  # (its re-tune waited for another process's: `replica_claims`)
            return
        if name in self._waits and not self._wait_over(name):
            return  # another process is tuning this graph: look again later (`replica_claims`)
        missing = missing_for_tuning(recorder, spec, varying_waits=not self._stateful)
        if missing == "samples":
            return
        if missing == "batch axis":
            self._note_once(
                f"batch-axis-{name}",
                f"{self.short}: graph {name} has {recorder.num_samples(name)} recordings but no batch axis yet "
                "(jit_config.batch_axis_required); still recording",
            )
            return
        self._pending = True

    def _become_stateful(self, changed: str, failure: Exception | str | None) -> None:
        """The forward changed its arguments in a call recorded without a copy taken before it: from the next call
        on, arguments are copied before each recorded call (see the module docstring), or the node is not
        replayable."""
        cause = f"its forward changes {changed}"
        if not jit_config.stateful_calls:
            self._not_replayable(f"{cause}, so its calls cannot be replayed for tuning (jit_config.stateful_calls "
                                 "is off)")
        elif failure is not None:
            self._not_replayable(f"{cause}, and {failure}")
        elif not self._stateful:
            self._stateful = cause
            self._note_once("stateful", f"{self.short}: {cause}; its calls are recorded on copies of their "
                                        "arguments taken before each call, and backends are validated on the state "
                                        "each call leaves behind")

    def _not_replayable(self, reason: str) -> None:
        """Recorded calls cannot be replayed: a RECORDING node stays eager (its children become candidates); a TUNED
        node keeps its tuned graphs but records no new ones."""
        if self.state is NodeState.RECORDING:
            self._go_eager(reason)
        else:
            self._recorder = None
            self._note_once("replay", f"{self.short}: new graphs are not tuned: {reason}")


#: the most a stateful call's argument tensors may hold, in MB, for them to be copied before every recorded call
#: (a sample keeps two copies: before and after the call; a graph keeps up to `config.max_num_samples_stored`)
STATEFUL_COPY_LIMIT_MB = 128.0
#: and the most, as a share of the GPU memory free at the time, for tensors on a GPU
STATEFUL_COPY_FREE_SHARE = 0.02


def state_too_large(args: tuple, kwargs: dict) -> str | None:
    """Why a stateful call's arguments are too large to copy for every recorded call (a long KV cache of a large
    model: copies on the GPU could take the memory the program needs), or None."""
    tensors = list(tensor_slots((args, kwargs)).values())
    total = sum(t.numel() * t.element_size() for t in tensors)
    limit = STATEFUL_COPY_LIMIT_MB * 2**20
    where = f"STATEFUL_COPY_LIMIT_MB={STATEFUL_COPY_LIMIT_MB:g}"
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    for device in devices:
        try:
            free, _total = torch.cuda.mem_get_info(device)
        except Exception:
            continue
        if free * STATEFUL_COPY_FREE_SHARE < limit:
            limit = free * STATEFUL_COPY_FREE_SHARE
            where = f"{STATEFUL_COPY_FREE_SHARE:.0%} of the {free / 2**30:.1f} GB free on {device}"
    if total <= limit:
        return None
    return f"its arguments hold {total / 2**20:.0f} MB of tensors, more than it copies before every recorded call " \
           f"({where})"


#: a stateful node whose first recorded calls each made a graph of their own (a list argument that grows by one
#: item per call) stays eager after this many: its graphs would never have two samples
NEW_LAYOUT_CALLS = 4


def _never_repeats(recorder: GraphRecorder) -> bool:
    calls = recorder.total_calls
    return calls >= NEW_LAYOUT_CALLS and len(recorder.graph_specs) == calls


def missing_for_tuning(recorder: GraphRecorder, spec: GraphSpec, varying_waits: bool = True) -> str | None:
    """What graph `spec` still lacks before it may be tuned: "samples" (fewer than `min_samples`, or than
    `min_samples_varying` once a non-batch axis varied, where `varying_waits`), "batch axis"
    (`batch_axis_required` and none found yet), or None when it is ready (the one readiness rule of a graph).
    A graph with free scalars (an int step that changes per call: `free_scalars`) has varied too: its warm-up
    needs a third value to show whether the trace specializes on it (`scalar_specialization`).
    `varying_waits` is False for a stateful node (each of its recorded calls copies its state on the serving
    thread, a KV cache whose length is that axis) and for a graph due for a re-tune over wider ranges (its
    calls were counted as misses: waiting for more could keep it from ever being tuned again)."""
    cfg = jit_config
    calls = recorder.num_samples(spec)
    if calls < cfg.min_samples:
        return "samples"
    varied = any(t.dynamic_axes() for t in spec.input_spec.tensors) or bool(spec.free_scalars())
    if varying_waits and varied and calls < cfg.min_samples_varying:
        return "samples"
    if cfg.batch_axis_required and not any(t.batch_axes() for t in spec.input_spec.tensors):
        return "batch axis"
    return None


def _ranges(spec: GraphSpec) -> str:
    """`x[1..8, 32..128]`-style summary of a graph's input ranges (for the history)."""
    parts = []
    for tensor in spec.input_spec.tensors:
        axes = ", ".join(f"{lo}..{hi}" if lo != hi else str(lo) for lo, hi in zip(tensor.min_shape, tensor.max_shape))
        parts.append(f"{tensor.name}[{axes}]")
    return " ".join(parts) or "its inputs"
