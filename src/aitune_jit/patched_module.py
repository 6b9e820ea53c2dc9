"""`PatchedModule`: one node of the observed call tree, attached to its module as a single small object.

A node is created the first time the hook sees its module called (see `hook.py`); the node on top of the
thread's call stack at that moment is its parent. What a node does per state:

- INIT: pushes itself on the call stack (so its children find their parent), nothing else.
- RECORDING: additionally owns a forward wrapper (an instance attribute `forward`, accelerate-hooks style)
  that records (inputs, output) of `forward` - after the user's pre-hooks, before the forward hooks - into a
  `GraphRecorder`; when a graph has `min_samples` recordings it is queued for the background worker
  (`worker.py` runs the node's `_tune_queued` under the root's lock; calls run eagerly meanwhile, nobody
  waits); with `jit_config.blocking` the call that made it ready tunes it. Tuning returns a `TuningOutcome`
  that the node applies (`node_transitions.py`).
- TUNED: the forward wrapper routes calls through a `GraphDispatcher` (backend per graph, eager fallback
  with one warning, new graphs recorded and tuned when they have enough samples). The user's forward
  pre/post hooks still run around it, because `Module.__call__` is untouched and only `forward` changed.
- EAGER / SKIPPED: no wrapper; pushes itself while its subtree may still change, and moves to the fast
  path once every child is there for `SETTLE_CALLS` calls in a row (a leaf after `SETTLE_CALLS` calls).
- TUNED (from `Module.__call__`'s point of view) and DETACHED: fast path, one lookup per call.

Nothing a node does may change what the program computes: every failure ends in the original forward.
"""

from __future__ import annotations

import copy
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from aitune_core.errors import brief
from aitune_core.forward_slot import ForwardSlot, SlotForward
from aitune_core.module_info import count_parameters
from aitune_jit.compile_exclusion import excluding_compiles
from aitune_jit.config import jit_config
from aitune_jit.follow_ups import FollowUps
from aitune_jit.node_recording import NodeRecording
from aitune_jit.node_registry import registry, subtree
from aitune_jit.node_transitions import NodeTransitions
from aitune_jit.node_views import NodeViews, format_count
from aitune_jit.range_growth import RangeGrowth
from aitune_jit.runtime import CANDIDATE, NODE_ATTR, in_dynamo_region, is_compiling, skip_as_top_frame, tls
from aitune_jit.state import NodeState
from aitune_jit.torch_call_site import call_forward
from aitune_jit.worker_yield import jobs_stepping_aside, request_finished, request_started

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.backends.dispatcher import GraphDispatcher
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneReport

_logger = logging.getLogger("aitune.jit")

#: calls of an EAGER / SKIPPED node with its whole subtree settled before it moves to the fast path
SETTLE_CALLS = 3


class PatchedModule(NodeTransitions, NodeRecording, NodeViews):
    """A module seen by the JIT hook; see the module docstring. Class-level views: `print_hierarchy`,
    `history` / `print_history`, `roots()`, `of(module)`."""

    #: every step JIT tuning took, in order (bounded; the registry's list, see `node_registry.py`)
    history: ClassVar[list[str]] = registry.history
    _registry_lock: ClassVar[threading.RLock] = registry.lock

    __slots__ = (
        "__weakref__",
        "_changed",
        "_checked_graphs",
        "_child_names",
        "_dispatcher",
        "_effects_seen",
        "_entries",
        "_failed",
        "_follow",
        "_forward_fn",
        "_growth",
        "_hooks_at_tune",
        "_module_ref",
        "_notes",
        "_pending",
        "_proxy",
        "_quiet",
        "_recorded_again",
        "_recorder",
        "_retired",
        "_retunes",
        "_slot",
        "_started",
        "_stateful",
        "_trainable",
        "_tune_lock",
        "_tuning",
        "_waited",
        "_waits",
        "call_count",
        "children",
        "descend",
        "fast",
        "level",
        "name",
        "num_parameters",
        "parent",
        "path",
        "reason",
        "reports",
        "state",
    )

    def __init__(self, module: torch.nn.Module, parent: PatchedModule | None) -> None:
        self._module_ref = weakref.ref(module)
        self.name = type(module).__name__
        self.parent = parent
        self.children: list[PatchedModule] = []
        self.level = parent.level + 1 if parent is not None else 0
        self.num_parameters = count_parameters(module)
        self.path = parent._child_path(module) if parent is not None else self.name
        self.call_count = 0
        self.state = NodeState.INIT
        self.reason: str | None = None
        self.fast = False
        self.descend = True  # EAGER / SKIPPED: whether the children may become candidates
        self.reports: list[TuneReport] = []
        self._tune_lock: threading.Lock = parent._tune_lock if parent is not None else threading.Lock()
        self._started = False
        self._trainable = False
        self._forward_fn: Callable[..., Any] | None = None
        self._slot: ForwardSlot | None = None
        self._recorder: GraphRecorder | None = None
        self._recorded_again = False  # the calls were recorded anew once after the module changed (`_record_again`)
        self._entries: list[tuple[GraphSpec, Backend]] = []
        self._retunes = 0  # tunings again after the backends stopped fitting the module (`_backends_outdated`)
        self._retired: list[Backend] = []  # backends out of service since the module changed (`_forget_tuning`)
        self._dispatcher: GraphDispatcher | None = None
        self._failed: dict[str, str] = {}
        self._growth = RangeGrowth()
        self._checked_graphs: set[str] = set()
        self._follow = FollowUps()
        self._pending = False
        self._tuning = False
        self._hooks_at_tune: int | None = None  # submodule hooks when the last tuning began (`ModuleWatch`)
        self._waits: dict[str, float] = {}  # graphs another process is tuning -> when to look again (monotonic)
        self._waited: dict[str, GraphSpec] = {}  # ... -> the graph as it was when this node began to wait
        self._stateful: str | None = None  # what its forward changes in its arguments (node_recording.py)
        self._effects_seen: str | None = None  # what a recorded call changed in the module (node_recording.py)
        self._quiet = 0
        self._proxy: torch.nn.Module | None = None
        self._child_names: dict[int, str] | None = None
        self._notes: set[str] = set()
        self._changed: str | None = None  # how the program replaced the module's forward (`_forward_changed`)
        with registry.lock:
            registry.add(self, parent)
            if parent is not None:
                # drop the nodes of children whose module died (e.g. `nn.Softmax()(x)` built inside forward):
                # otherwise an untuned parent would keep one node per call forever
                parent.children = [child for child in parent.children if child._module_ref() is not None]
                parent.children.append(self)
                parent._quiet = 0

    # ------------------------------------------------------------------------------------------ identity / views
    @property
    def module(self) -> torch.nn.Module | None:
        return self._module_ref()

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # A deepcopy / pickle of the module must not share (or carry) this node. A deepcopy gets CANDIDATE (a
        # fresh candidate, adopted on its first call: the marker deep-copies to itself); a pickle gets None (the
        # marker pickles as None): never seen, and nothing of aitune in the pickle.
        return (copy.copy, (CANDIDATE,))

    def _child_path(self, module: torch.nn.Module) -> str:
        names = self._child_names
        if names is None or id(module) not in names:
            own = self.module
            names = {id(sub): name for name, sub in own.named_modules(remove_duplicate=False)} if own else {}
            self._child_names = names
        relative = names.get(id(module))
        return f"{self.path}.{relative}" if relative else f"{self.path}->{type(module).__name__}"

    @classmethod
    def of(cls, module: torch.nn.Module) -> PatchedModule | None:
        """The node of `module`, or None when the hook has not made it one."""
        slot = module.__dict__.get(NODE_ATTR)
        return slot if isinstance(slot, PatchedModule) else None

    @classmethod
    def roots(cls) -> list[PatchedModule]:
        return registry.roots()  # type: ignore[return-value]

    @classmethod
    def walk(cls) -> Iterator[PatchedModule]:
        """Every live node, depth first, parents before children."""
        return registry.walk()  # type: ignore[return-value]

    def subtree(self) -> Iterator[PatchedModule]:
        return subtree(self)  # type: ignore[return-value]

    @staticmethod
    def _log(message: str, level: int = logging.INFO) -> None:
        registry.log(message, level)

    def _note_once(self, key: str, message: str, level: int = logging.INFO) -> None:
        if key not in self._notes:
            self._notes.add(key)
            self._log(message, level)

    # ------------------------------------------------------------------------------------------ the call path
    def observed_call(self, call: Callable[..., Any], module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        """`Module.__call__` of a node that is not on the fast path: keeps the call stack and the counts."""
        self.call_count += 1
        if not self._started:
            self._start()
        stack = tls.stack
        depth = len(stack)
        outermost = not depth  # a request: a background job steps aside while it runs (worker_yield)
        try:  # (everything inside: a program's signal handler may raise between any two steps)
            stack.append(self)
            if outermost:
                request_started()
            return call(module, args, kwargs)
        finally:
            del stack[depth:]
            if outermost:
                request_finished()
            state = self.state
            if state is NodeState.EAGER or state is NodeState.SKIPPED:
                self._settle()

    def _settle(self) -> None:
        """An EAGER / SKIPPED node moves to the fast path once its subtree stopped changing: every child
        on the fast path for `SETTLE_CALLS` consecutive calls without a new child. (A module first called
        under a settled node later, e.g. in a branch never taken so far, attaches to the nearest node above.)"""
        if all(child.fast for child in self.children):
            self._quiet += 1
            if self._quiet >= SETTLE_CALLS:
                self.fast = True
        else:
            self._quiet = 0

    def _start(self) -> None:
        with PatchedModule._registry_lock:
            if self._started:
                return
            self._started = True
            self._log(f"New {'top' if self.parent is None else 'child'} module: {self}")
            parent = self.parent
            if parent is not None and (
                parent.state in (NodeState.TUNED, NodeState.DETACHED)
                or (parent.state in (NodeState.SKIPPED, NodeState.EAGER) and not parent.descend)
            ):
                self._detach()
                return
            reason = self._skip_reason()
            if reason is not None:
                self.state = NodeState.SKIPPED
                self.reason = reason
                self.descend = not self._routed_elsewhere()
                self._log(f"Skipping {self.short}: {reason}")
            elif parent is None or parent.is_open:
                self._become_candidate()

    def _routed_elsewhere(self) -> bool:
        """Whether another owner's forward slot routes the module's calls (an `aitune.torch.Module` wrapper): the
        JIT leaves it and its subtree alone (it wrapped that slot in its own, and `aitune.torch.save` then found no
        wrapper: "no aitune Module found")."""
        module = self.module
        slot = ForwardSlot.of(module) if module is not None else None
        return slot is not None and slot is not self._slot

    def _skip_reason(self) -> str | None:
        cfg = jit_config
        module = self.module
        if self._routed_elsewhere():
            return "it is tuned ahead of time (an aitune.torch.Module wraps it)"
        qualified = f"{type(module).__module__}.{type(module).__qualname__}" if module is not None else self.name
        if self.name in cfg.skip_modules or qualified in cfg.skip_modules:
            return f"{self.name} is in jit_config.skip_modules"
        if self.level > cfg.max_depth_level:
            return f"level {self.level} is deeper than jit_config.max_depth_level={cfg.max_depth_level}"
        if self.num_parameters < cfg.min_parameters:
            return (
                f"{format_count(self.num_parameters)} parameters is fewer than "
                f"jit_config.min_parameters={cfg.min_parameters}"
            )
        return None

    @property
    def is_open(self) -> bool:
        """True when this node will not be tuned itself and its children may be (all ancestors agree)."""
        node: PatchedModule | None = self
        while node is not None:
            if node.state not in (NodeState.EAGER, NodeState.SKIPPED) or not node.descend:
                return False
            node = node.parent
        return True

    # ------------------------------------------------------------------------------------------ forward wrapper
    def _install_forward(self, module: torch.nn.Module) -> None:
        if self._slot is not None:
            return
        self._slot = ForwardSlot(module, self._forward, label=self.path, on_change=self._forward_changed).install()
        self._forward_fn = self._slot.original

    def _forward_changed(self, what: str) -> bool:
        """The program replaced the module's forward (a class-level patch, a `__class__` swap; `ForwardSlot`): what
        was recorded and tuned ran the old one. The node stops routing and stays eager, with one WARNING; a job
        still tuning it finds its outcome dropped (`apply`). Never waits: while another thread compiles, the slot
        keeps passing calls to the new forward and asks again at the next call (returns False)."""
        self._changed = what
        with excluding_compiles(wait_s=0) as alone:
            if not alone:
                return False
            slot = self._slot
            if self.state in (NodeState.RECORDING, NodeState.TUNED) and slot is not None:
                self._entries = []  # (a library's routine swap, `parametrize`, is no news to the user: INFO)
                self._go_eager(f"its forward changed while aitune watched it ({what}); the new forward runs eagerly "
                               "from now on", reopen=False,
                               level=logging.INFO if slot.routine_change else logging.WARNING)
            return True

    def _uninstall_forward(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.remove()

    def _forward(self, args: tuple, kwargs: dict) -> Any:
        """The module's `forward` while RECORDING or TUNED."""
        forward = self._forward_fn
        if is_compiling() or tls.bypass or in_dynamo_region() or torch._C._get_tracing_state() is not None:
            return forward(*args, **kwargs)  # type: ignore[misc]  (torch.jit.trace records the original, as dynamo)
        state = self.state
        if state is NodeState.TUNED:
            if jobs_stepping_aside() and not tls.stack:
                return self._tuned_request(forward, args, kwargs)
            if self._recordable(args, kwargs):
                return self._dispatch(args, kwargs)
            return self._unrouted(forward, args, kwargs)
        if state is NodeState.RECORDING and self._recordable(args, kwargs):  # recorded during its job too
            return self._recorded_call(forward, args, kwargs)  # type: ignore[arg-type]
        return call_forward(forward, args, kwargs)  # type: ignore[arg-type]

    @staticmethod
    def _unrouted(forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A tuned node's call that no backend takes (training mode, gradients): the original forward, with the
        thread's module calls as aitune's own, like the backends' (`tls.bypass`). A submodule the program put in since
        tuning (`net.fc2 = nn.Linear(...)`) is first called here: adopted as a node of its own, its forward wrapper
        would sit in its `__dict__`, where the compiled graph's guards see it, and every later call of the tuned
        module would miss that graph."""
        state = tls
        state.bypass += 1
        try:
            return call_forward(forward, args, kwargs)
        finally:
            state.bypass -= 1

    def _tuned_request(self, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A tuned node's call outside any node's call while a job runs (re-tuning a range, tuning another module):
        a request the job steps aside for, as `observed_call` counts the calls of nodes off the fast path."""
        try:  # (the count inside: see `observed_call`)
            request_started()
            if self._recordable(args, kwargs):
                return self._dispatch(args, kwargs)
            return self._unrouted(forward, args, kwargs)
        finally:
            request_finished()

    def _become_candidate(self) -> None:
        from aitune_core.recording.graph_recorder import GraphRecorder

        module = self.module
        if module is None:
            return
        self._trainable = any(p.requires_grad for p in module.parameters())
        self._install_forward(module)
        self._recorder = GraphRecorder(self._forward_fn, name=self.path)  # type: ignore[arg-type]
        self.state = NodeState.RECORDING

    # ------------------------------------------------------------------------------------------ tuned dispatch
    def _dispatch(self, args: tuple, kwargs: dict) -> Any:
        dispatcher = self._dispatcher
        if dispatcher is None:  # (released - JIT switched off - while the program kept `m.forward`: plain forward)
            return call_forward(self._forward_fn, args, kwargs)  # type: ignore[arg-type]
        state = tls
        state.bypass += 1
        try:
            return dispatcher(*args, **kwargs)  # type: ignore[misc]
        finally:
            state.bypass -= 1

    def _fallback(self, *args: Any, **kwargs: Any) -> Any:
        """Calls no tuned graph accepts: run the original forward; record them so new graphs get tuned."""
        if self._recorder is None:
            return call_forward(self._forward_fn, args, kwargs)  # type: ignore[arg-type]
        return self._recorded_call(self._forward_fn, args, kwargs)  # type: ignore[arg-type]

    def _original_call(self, *args: Any, **kwargs: Any) -> Any:
        """The original forward, for calls the dispatcher does not send to a backend (a changed module, a failed
        backend): called from torch's call line, so a forward's `stacklevel=2` warning names torch's frame."""
        return call_forward(self._forward_fn, args, kwargs)  # type: ignore[arg-type]

    def _backend_failed(self, backend: Backend, exc: Exception) -> None:
        """A tuned backend raised at run time and the original forward answered the call (the dispatcher did that;
        had the original raised too, the call itself was at fault and nothing reaches here): run its graphs
        eagerly from now on."""
        failed = [(spec, b) for spec, b in self._entries if b is backend]
        if not failed:  # a backend already replaced (and released) by a re-tune or an upgrade: nothing to blame
            return
        self._entries = [(spec, b) for spec, b in self._entries if b is not backend]
        why = brief(exc)  # (torch's errors run to pages: a traceback's worth went into one WARNING)
        for spec, _b in failed:
            self._failed[spec.name] = f"backend failed at run time: {why}"
        self._log(f"Backend {backend.describe() if backend else '?'} of {self.short} failed at run time ({why}); "
                  "that graph runs eagerly from now on", logging.WARNING)
        _logger.debug("Backend failure in %s", self.path, exc_info=True)
        if self._entries:
            self._dispatcher = self._new_dispatcher()
            self._record_tuned()  # the backends that are left
        else:
            self._go_eager(f"its backend failed at run time ({why})", reopen=False)

    def _new_dispatcher(self) -> GraphDispatcher:
        from aitune_core.backends.dispatcher import GraphDispatcher
        from aitune_core.backends.module_watch import ModuleWatch

        module = self.module
        old = self._dispatcher
        previous = old.watch if old is not None else None
        watch = (ModuleWatch(module, self.backends, self.path, previous, hooks_at_tune=self._hooks_at_tune)
                 if module is not None else None)
        return GraphDispatcher(self._entries, self._fallback, self.path, on_backend_error=self._backend_failed,
                               watch=watch, original=self._original_call, warned=old.warned if old else None,
                               on_outdated=self._backends_outdated, on_code_missed=self._code_missed,
                               on_plain_run=self._missed_call)

    @classmethod
    def release_all(cls) -> None:
        """Release every node and forget the hierarchy (the history stays)."""
        with registry.lock:
            for node in list(cls.walk()):
                node._release()
            registry.forget_roots()

    @classmethod
    def clear_history(cls) -> None:
        registry.clear_history()


skip_as_top_frame(
    SlotForward.__call__,
    PatchedModule.observed_call,
    PatchedModule._forward,
    PatchedModule._dispatch,
    PatchedModule._fallback,
    PatchedModule._recorded_call,
)
