"""`GraphDispatcher`: route a call to the backend tuned for its graph, or to the fallback (the original module).

A call goes to the backend of the first GraphSpec that `accepts` it (same argument layout, tensor ranks and dtypes,
strict-mode constants, and every axis inside the tuned [min, max] range). Otherwise it goes to `fallback` and a
WARNING is logged naming the module and the offending shapes - once per (module name, reason), where the reason is
the mismatch text with its numbers removed, so a stream of calls with new sequence lengths does not flood the log.

With a `ModuleWatch` (`module_watch.py`), every call first asks `watch.stale()` (one integer comparison, plus
version counters when a backend baked the weights): after a change to the module the watch's verdict decides
whether the backends may serve, refitting stale baked-weight backends through `refit` (by default
`refit.refit_backend`, synchronous); a call they may not serve goes to `original` (the module's own forward,
not recorded: a call made in training mode or with a hook on a submodule is no sample of the tuned graph).
After a change of the module's structure (`Verdict.reshaped`: `.to(torch.bfloat16)`, a submodule of another class)
an `on_outdated` handler, where the owner has one, is told what changed: the JIT tunes the module again
(`on_outdated` returns True once it took the news; until then it is asked again at each call). Either way the
backends compiled for the old structure no longer serve, and with `on_outdated` none is refit on the caller's
thread. Calls go to a backend through `Backend.serve`: a compiled backend whose guards fail answers with the plain
forward instead of compiling (`CompiledCodeMissed`, `run_only.py`), where the owner has an `on_code_missed` handler:
it is told the graph of each such call (the JIT tunes that graph again after a few) and returns False when the
backend should compile inside the call again, as torch.compile does (what no re-tuning could fix: an input layout
the recorded calls never had). Without a handler (the AOT wrapper) calls go to `Backend.infer`, as before.

A backend that raises at run time (with an `on_backend_error` handler) is answered by the original forward, here,
for every caller: if the original forward raises too, the call itself is at fault (the user's own error, e.g. a
check in their forward) and that error propagates as without aitune, with nothing blamed on the backend;
otherwise the handler - the caller's policy (the JIT drops that backend, the AOT wrapper warns once) - gets the
backend and the exception, and the original's output is the call's answer. Errors of the fallback itself always
propagate. One error blames nobody: dynamo refuses to run a compiled function while FX tracing is in progress
anywhere in the process (torch keeps that flag process-wide, and the background worker traces while requests run);
such a call is answered by the original forward and the backend keeps serving; so is a call made inside a
`torch.func` transform (`torch.vmap(model)`, `torch.func.grad`), which torch does not run compiled functions under
(before, one `vmap` call sent the module to eager for good). Every call is the original
forward's while an FX trace runs anywhere in the process (torch's process-wide flag: AOTAutograd's make_fx of a
tuning job, an export) and while `dispatch_pause` is held (the worker exports a graph): a compiled backend called
then could recompile on the caller's thread, trace into FX's patched module call and fail (seen on an H100).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx._symbolic_trace as _fx_trace

from aitune_core.backends.dispatch_pause import HOLDERS as PAUSE_HOLDERS
from aitune_core.backends.isolated_entry import set_plain_runner
from aitune_core.errors import CompiledCodeMissed
from aitune_core.log import get_logger

#: what dynamo raises when a compiled function is called while `torch.fx` traces somewhere in the process
NESTED_FX_TRACE_REFUSAL = "symbolically trace a dynamo-optimized function"
#: the file of FX's module-call patch, named in dynamo's error when it traced into it (`refused_while_...`)
FX_TRACER_FRAME = "fx/_symbolic_trace.py"

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.backends.module_watch import ModuleWatch, Verdict
    from aitune_core.specs.graph_spec import GraphSpec

_logger = get_logger("dispatch")
_NUMBERS = re.compile(r"\d+")


def functorch_transforms_active() -> bool:
    """Whether the call runs inside a `torch.func` transform (vmap, grad, jvp): asked after a backend failed, and by
    the JIT before it records or dispatches a call (a compiled function cannot run under such a transform)."""
    check = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(check()) if check is not None else False


class GraphDispatcher:
    """Callable that runs `backend.infer(*args, **kwargs)` for the graph the call belongs to, else `fallback`."""

    __slots__ = ("_compiling", "_entries", "_fallback", "_lock", "_on_backend_error", "_on_code_missed", "_on_outdated",
                 "_on_plain_run", "_original", "_refit", "_single", "_warned", "_watch", "code_misses", "lazy_objects",
                 "misses", "name")

    def __init__(
        self,
        entries: Sequence[tuple[GraphSpec, Backend]],
        fallback: Callable[..., Any],
        name: str,
        on_backend_error: Callable[[Backend, Exception], None] | None = None,
        *,
        watch: ModuleWatch | None = None,
        original: Callable[..., Any] | None = None,
        refit: Callable[[Backend], bool] | None = None,
        warned: set[tuple[str, str]] | None = None,
        on_outdated: Callable[[str], bool] | None = None,
        on_code_missed: Callable[[str], bool] | None = None,
        on_plain_run: Callable[[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any] | None = None,
    ) -> None:
        self._on_outdated = on_outdated
        self._on_code_missed = on_code_missed
        self._on_plain_run = on_plain_run
        self.code_misses = 0  # calls a backend answered with the plain forward (`CompiledCodeMissed`)
        # object arguments are not walked where the call's tensors single out a graph whose backend checks their
        # layout itself (`Backend.checks_object_layouts`); off after the first call that missed the compiled code
        self.lazy_objects = True
        self._compiling: set[int] = set()  # backends whose owner lets them compile inside a call again
        self._entries: tuple[tuple[GraphSpec, Backend], ...] = tuple(entries)
        self._fallback = fallback
        self._on_backend_error = on_backend_error
        self._single = self._entries[0] if len(self._entries) == 1 else None
        # reasons already warned about; a dispatcher that replaces another (a re-tuned graph) shares its set, so a
        # cause is warned once per module, not once per dispatcher
        self._warned: set[tuple[str, str]] = warned if warned is not None else set()
        self.misses = 0  # calls that went to the fallback
        self.name = name
        self._watch = watch
        self._original = original if original is not None else fallback
        if refit is None:
            from aitune_core.backends.refit import refit_backend

            refit = refit_backend
        self._refit = refit
        self._lock = threading.Lock()

    @property
    def entries(self) -> tuple[tuple[GraphSpec, Backend], ...]:
        return self._entries

    @property
    def warned(self) -> set[tuple[str, str]]:
        """The (module, reason) pairs warned about so far (shared with a dispatcher that replaces this one)."""
        return self._warned

    @property
    def fallback(self) -> Callable[..., Any]:
        return self._fallback

    @property
    def watch(self) -> ModuleWatch | None:
        return self._watch

    def backend_for(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Backend | None:
        """The backend that would serve the call, or None (fallback)."""
        for spec, backend in self._entries:
            if spec.accepts(args, kwargs):
                return backend
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if PAUSE_HOLDERS[0] or _fx_trace._is_fx_tracing_flag:  # a trace that compiled calls must not meet
            return self._original(*args, **kwargs)
        watch = self._watch
        if watch is not None and watch.stale():
            return self._changed(args, kwargs)
        single = self._single
        if single is not None:
            if single[0].accepts(args, kwargs, not (self.lazy_objects and single[1].checks_object_layouts)):
                return self._run(single[0], single[1], args, kwargs)
        else:
            chosen = self._choose(args, kwargs)
            if chosen is not None:
                return self._run(chosen[0], chosen[1], args, kwargs)
        self._missed(args, kwargs)
        return self._fallback(*args, **kwargs)

    def _choose(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[GraphSpec, Backend] | None:
        """The entry that serves the call. Walking object arguments (a `DynamicCache`'s layout, about 65 us per
        decoding step on this project's CPU) is left out where the other checks leave one entry and its backend
        checks that layout itself; where several are left, the layouts decide."""
        entries = self._entries
        if self.lazy_objects:
            entries = tuple(entry for entry in entries if entry[0].accepts(args, kwargs, False))
            if len(entries) == 1 and entries[0][1].checks_object_layouts:
                return entries[0]
        for spec, backend in entries:
            if spec.accepts(args, kwargs):
                return spec, backend
        return None

    def _run(self, spec: GraphSpec, backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        plain_error: Exception | None = None
        try:
            if self._on_code_missed is None or id(backend) in self._compiling:
                return backend.infer(*args, **kwargs)
            if self._on_plain_run is None:
                return backend.serve(*args, **kwargs)
            return self._serve_watching_plain_runs(spec.name, backend, args, kwargs)
        except CompiledCodeMissed as missed:
            if missed.error is None:
                self._code_missed(spec.name, backend)
                return missed.output
            plain_error = missed.error
        except Exception as exc:
            if self._on_backend_error is None:
                raise
            failure = exc
        if plain_error is not None:  # the plain forward ran and raised: the user's own error, as in a plain run
            raise plain_error
        # the original forward runs outside the handler above: an error it raises is chained exactly as in a plain
        # run (its own `raise ... from e`, its own context), never to the backend's error (a `from None` here wiped
        # a user's `__cause__`)
        if refused_while_another_thread_traces(failure) or functorch_transforms_active():
            # nothing wrong with the backend (a compiled function under `torch.vmap`/`torch.func.grad` is not
            # supported by torch): no blame, no warning; later plain calls are served by it again
            return self._original(*args, **kwargs)
        try:
            output = self._original(*args, **kwargs)
        except Exception:
            _logger.debug("Module `%s`: the original forward fails on this call too (backend %s: %r)",
                          self.name, backend.describe(), failure)
            raise
        self._on_backend_error(backend, failure)
        return output

    def _serve_watching_plain_runs(self, graph: str, backend: Backend, args: tuple[Any, ...],
                                   kwargs: dict[str, Any]) -> Any:
        """`backend.serve`, where a call that misses the compiled code runs through the owner's `on_plain_run`
        (which may record it: its input layout is one the compile never saw, `isolated_entry.set_plain_runner`)."""
        on_plain = self._on_plain_run

        def runner(target: Callable[..., Any], a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            return on_plain(graph, target, a, k)  # type: ignore[misc]

        before = set_plain_runner(runner)
        try:
            return backend.serve(*args, **kwargs)
        finally:
            set_plain_runner(before)

    def _code_missed(self, graph: str, backend: Backend) -> None:
        """A backend answered a call of `graph` with the plain forward: its compiled code's guards failed
        (`run_only.py`). The owner hears of each such call, and may let the backend compile in the call again."""
        self.code_misses += 1
        self.lazy_objects = False  # (the layout may have been another graph's: walk it from now on)
        try:
            keep = self._on_code_missed(graph)  # type: ignore[misc]
        except Exception:  # (the owner's bookkeeping must never fail the call)
            _logger.debug("Module `%s`: on_code_missed failed", self.name, exc_info=True)
            keep = False
        if not keep:
            self._compiling.add(id(backend))
        if (self.name, "guards") not in self._warned:
            self._warned.add((self.name, "guards"))
            _logger.info("Module `%s`: a call no longer fits its compiled graph (dynamo's guards fail: the program "
                         "changed a global, a module attribute, a config value or an input layout the graph was "
                         "traced with); such calls run the original forward, not a compile on the caller's thread",
                         self.name)

    def settle(self) -> Verdict | None:
        """Review the module now if it changed (refitting stale backends) and return the verdict (None without a
        watch): a caller about to save the backends must not save ones that are waiting for a refit."""
        watch = self._watch
        if watch is None:
            return None
        with self._lock:
            return watch.review(self._refit)

    # ------------------------------------------------------------------ slow path
    def _changed(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The module may have changed since the backends were built: serve only what the watch allows. One
        thread reviews (and refits) at a time; the others are answered by the original module meanwhile."""
        if not self._lock.acquire(blocking=False):
            return self._original(*args, **kwargs)
        try:
            verdict = self._watch.review(self._refit, refit_reshaped=self._on_outdated is None)  # type: ignore[union-attr]
        finally:
            self._lock.release()
        if verdict.reshaped is not None and self._on_outdated is not None and self._on_outdated(verdict.reshaped):
            return self._original(*args, **kwargs)  # (the owner re-routes the module's later calls)
        if verdict.divert is not None:
            return self._original(*args, **kwargs)
        for spec, backend in self._entries:
            if spec.accepts(args, kwargs):
                if id(backend) in verdict.blocked:
                    return self._original(*args, **kwargs)
                return self._run(spec, backend, args, kwargs)
        self._missed(args, kwargs)
        return self._fallback(*args, **kwargs)

    def _missed(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.misses += 1
        try:
            reasons = [(spec.name, spec.mismatch(args, kwargs) or "no reason given") for spec, _ in self._entries]
        except Exception as exc:  # explaining must never break the user's call
            reasons = [("?", f"could not explain the mismatch: {type(exc).__name__}: {exc}")]
        if not reasons:
            reasons = [("-", "no tuned graph")]
        key = (self.name, "; ".join(_NUMBERS.sub("#", reason) for _, reason in reasons))
        if key in self._warned:
            return
        self._warned.add(key)
        # one WARNING per module: a forward taking *args / **kwargs showed one per argument combination
        first = (self.name, "") not in self._warned
        self._warned.add((self.name, ""))
        details = "; ".join(f"graph {name}: {reason}" for name, reason in reasons)
        _logger.log(
            logging.WARNING if first else logging.DEBUG,
            "Module `%s`: call does not match any tuned graph, running the original module instead (%s). "
            "This warning is shown once per module; other mismatches are logged at DEBUG (logger aitune.dispatch).",
            self.name,
            details,
        )


def refused_while_another_thread_traces(exc: BaseException) -> bool:
    """True when the failure comes from another thread's FX trace, not from the backend: torch's tracing flag and
    its patch of `torch.nn.Module.__call__` are process-wide while a tuning job traces (AOTAutograd's make_fx,
    torch.export), so a compiled backend refuses calls for a moment (`NESTED_FX_TRACE_REFUSAL`), or dynamo,
    recompiling for this call, traces into FX's patched module call (`FX_TRACER_FRAME` in its error; seen on an
    H100 while the worker exported a graph). The original forward answers such calls and the backend is kept."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and NESTED_FX_TRACE_REFUSAL in text:
        return True
    return isinstance(exc, RuntimeError) and FX_TRACER_FRAME in text  # dynamo's errors are RuntimeErrors
