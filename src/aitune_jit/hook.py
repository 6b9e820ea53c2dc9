"""The one patch of `torch.nn.Module.__call__`, and the adoption of modules into the hierarchy.

Hot path (every module call in the process while the patch is installed):

    if dynamo is tracing:                 -> original __call__ (dynamo never traces into the hook)
    slot = module._aitune_jit_node        # one instance-dict lookup (NODE_ATTR)
    if slot is not None and slot.fast:    -> original __call__ (settled, detached, tuned, excluded)
    else                                  -> `_slow_call` (adoption, call-stack bookkeeping)

Per-module state is ONE object stored in the module's `__dict__` under `NODE_ATTR`: a `PatchedModule` node,
or a `Marker` for modules that are not nodes. `uninstall()` removes every such object and every forward
wrapper, and puts the original `__call__` back (identity).

Modes: in import / env-var mode (`set_global_mode(True)`) every module outside the excluded packages becomes
a node. In decorator mode only modules constructed inside `prepare_for_jit_tuning()` scopes do: while a
scope is open, `torch.nn.Module.__init__` is wrapped to mark the modules it initializes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from aitune_core import torchscript_slots
from aitune_core.patch import Patch
from aitune_jit import compiling_flag, dynamo_module_call, job_rng, module_copies, runtime, summary
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import (
    CANDIDATE,
    NODE_ATTR,
    OUT_OF_SCOPE,
    PASS,
    Marker,
    is_installed,
    process,
    skip_as_top_frame,
    tls,
)

_logger = logging.getLogger("aitune.jit")

#: classes whose module lives here are torch's (or aitune's) machinery, never nodes
EXCLUDED_PACKAGES: tuple[str, ...] = (
    "torch._dynamo",
    "torch._inductor",
    "torch._export",
    "torch._functorch",
    "torch._higher_order_ops",
    "torch._subclasses",
    "torch.ao.quantization",
    "torch.distributed",
    "torch.export",
    "torch.fx",
    "torch.jit",
    "torch.nn.parallel",
    "torch.utils",
    "aitune",
    "aitune_aot",
    "aitune_core",
    "aitune_jit",
)
#: containers are never nodes: their children attach to the nearest node above (exact types only, so a
#: user's subclass with its own forward, e.g. `class Block(nn.Sequential)`, is a node)
CONTAINER_TYPES: tuple[type, ...] = (
    torch.nn.Sequential,
    torch.nn.ModuleList,
    torch.nn.ModuleDict,
    torch.nn.ParameterList,
    torch.nn.ParameterDict,
)


class _HookState:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.global_mode = False
        self.call_patch: Patch | None = None  # torch.nn.Module.__call__ while installed
        self.init_patch: Patch | None = None  # torch.nn.Module.__init__ while a decorator scope is open
        self.open_scopes = 0
        self.touched: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.excluded: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


_state = _HookState()


# ---------------------------------------------------------------------------------------------- classification
def is_excluded(cls: type) -> bool:
    """True for torch internals, aitune's own modules and containers (cached per class)."""
    cached = _state.excluded.get(cls)
    if cached is None:
        module_name = getattr(cls, "__module__", "") or ""
        cached = cls in CONTAINER_TYPES or any(
            module_name == package or module_name.startswith(package + ".") for package in EXCLUDED_PACKAGES
        )
        with contextlib.suppress(TypeError):  # classes are weak-referenceable; be safe anyway
            _state.excluded[cls] = cached
    return cached


def _adopt(module: torch.nn.Module) -> Any:
    """Decide what `module` is on its first observed call: a new node or a marker. Thread-safe."""
    with _state.lock:
        slot = module.__dict__.get(NODE_ATTR)
        if isinstance(slot, PatchedModule) or slot is PASS:
            return slot  # another thread adopted it meanwhile
        if is_excluded(type(module)) or getattr(module, "_compiled_call_impl", None) is not None:
            result: Any = PASS
        elif not _state.global_mode and slot is not CANDIDATE:
            result = OUT_OF_SCOPE
        else:
            result = PatchedModule(module, runtime.current_node())
        module.__dict__[NODE_ATTR] = result
        _state.touched.add(module)
        return result


def _mark_pass(module: torch.nn.Module) -> None:
    with _state.lock:
        module.__dict__[NODE_ATTR] = PASS
        _state.touched.add(module)


def _slow_call(call: Callable[..., Any], module: torch.nn.Module, slot: Any, args: tuple, kwargs: dict) -> Any:
    if tls.bypass:
        if slot is None or slot is CANDIDATE:
            # First called by aitune itself (a backend's compiled wrapper or working copy, a view built for
            # tuning, a module new under a tuned one): never a node; settle it on the fast path.
            _mark_pass(module)
        return call(module, args, kwargs)
    if (
        not process.installed
        or runtime.is_compiling()  # torch.export (non-strict) runs modules in Python on fake tensors
        or runtime.in_dynamo_region()  # a torch.compile'd call (see skip_as_top_frame)
        or torch._C._get_tracing_state() is not None  # torch.jit.trace
    ):
        return call(module, args, kwargs)
    if slot is None or type(slot) is Marker:
        slot = _adopt(module)
        if slot.fast:
            return call(module, args, kwargs)
    return slot.observed_call(call, module, args, kwargs)


def _make_patched_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement `Module.__call__`.

    When `original` is torch's own `Module._wrapped_call_impl` (nobody patched `__call__` before us), the
    replacement does its job itself (`_compiled_call_impl` or `_call_impl`) instead of calling it, so an
    untuned module call costs the same number of Python frames as without the hook.
    """
    is_compiling = runtime.is_dynamo_compiling
    slow_call = _slow_call

    if original is getattr(torch.nn.Module, "_wrapped_call_impl", None):

        def call(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
            compiled = module._compiled_call_impl
            if compiled is not None:
                return compiled(*args, **kwargs)
            return module._call_impl(*args, **kwargs)

        def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                return original(self, *args, **kwargs)
            try:
                slot = self._aitune_jit_node  # NODE_ATTR; a plain instance attribute once the module was seen
            except AttributeError:
                slot = None
            if slot is not None and slot.fast:
                if self._compiled_call_impl is not None:
                    return self._compiled_call_impl(*args, **kwargs)
                return self._call_impl(*args, **kwargs)
            return slow_call(call, self, slot, args, kwargs)

    else:  # someone else patched __call__ first: chain to it

        def call(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
            return original(module, *args, **kwargs)

        def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                return original(self, *args, **kwargs)
            slot = self.__dict__.get(NODE_ATTR)
            if slot is not None and slot.fast:
                return original(self, *args, **kwargs)
            return slow_call(call, self, slot, args, kwargs)

    skip_as_top_frame(__call__, call)
    return __call__


skip_as_top_frame(_slow_call)


# ---------------------------------------------------------------------------------------------- install / uninstall
def install() -> None:
    """Patch `torch.nn.Module.__call__` (idempotent). Modules are adopted per the current mode."""
    with _state.lock:
        if is_installed():
            return
        job_rng.preload_rich()  # (here, on the program's thread: see job_rng)
        original = torch.nn.Module.__call__
        patched = _make_patched_call(original)
        _state.call_patch = Patch(torch.nn.Module, "__call__", patched).apply()
        if original is getattr(torch.nn.Module, "_wrapped_call_impl", None):  # (see dynamo_module_call)
            dynamo_module_call.register(patched, original)
        module_copies.install()
        torchscript_slots.install()
        compiling_flag.install()
        process.installed = True
        summary.register_atexit()
        _logger.debug("torch.nn.Module.__call__ patched for JIT tuning")


def uninstall() -> None:
    """Restore `torch.nn.Module.__call__` exactly, detach every node and remove every per-module object."""
    with _state.lock:
        set_global_mode(False)
        _close_all_scopes()
        if is_installed():
            if not _state.call_patch.restore():  # type: ignore[union-attr]
                _logger.warning(
                    "torch.nn.Module.__call__ was patched again after aitune patched it; leaving the newer patch in "
                    "place (aitune's hook now passes every call straight through)"
                )
            process.installed = False
            dynamo_module_call.unregister()
            module_copies.uninstall()
            torchscript_slots.uninstall()
            compiling_flag.uninstall()
        PatchedModule.release_all()
        for module in list(_state.touched):
            module.__dict__.pop(NODE_ATTR, None)
        _state.touched = weakref.WeakSet()
        _logger.debug("JIT tuning hook removed")


def is_global_mode() -> bool:
    return _state.global_mode


def set_global_mode(enabled: bool) -> None:
    """Import / env-var mode: every module outside the excluded packages is adopted (also ones built earlier)."""
    with _state.lock:
        _state.global_mode = bool(enabled)
        OUT_OF_SCOPE.fast = not enabled


def original_call() -> Callable[..., Any]:
    """The `__call__` in place before the patch (the current one when not installed)."""
    patch = _state.call_patch
    return patch.original if is_installed() and patch is not None else torch.nn.Module.__call__


# ---------------------------------------------------------------------------------------------- decorator scopes
def _make_patched_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if tls.scope > 0 and NODE_ATTR not in self.__dict__:
            self.__dict__[NODE_ATTR] = CANDIDATE
            _state.touched.add(self)

    __init__.__aitune_jit_scope__ = True  # type: ignore[attr-defined]
    return __init__


def open_scope() -> None:
    """Modules this thread constructs until `close_scope()` are candidates (decorator mode)."""
    with _state.lock:
        install()
        if _state.open_scopes == 0:
            init = torch.nn.Module.__init__
            _state.init_patch = Patch(torch.nn.Module, "__init__", _make_patched_init(init)).apply()
        _state.open_scopes += 1
    tls.scope += 1


def close_scope() -> None:
    tls.scope = max(0, tls.scope - 1)
    with _state.lock:
        if _state.open_scopes == 0:
            return
        _state.open_scopes -= 1
        if _state.open_scopes == 0:
            _restore_init()


def _restore_init() -> None:
    if _state.init_patch is not None:
        _state.init_patch.restore()
    _state.init_patch = None


def _close_all_scopes() -> None:
    if _state.open_scopes:
        _state.open_scopes = 0
        _restore_init()
