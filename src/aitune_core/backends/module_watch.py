"""`ModuleWatch`: what a tuned module's backends depend on, and a per-call check that it did not change.

A backend was built from the module as it was when it was tuned. Afterwards the user may edit weights in place,
`load_state_dict` (with or without `assign`), replace a submodule, move or cast the model, switch training on, or
register hooks on a submodule. The watch records, at tune time (a `ModuleSnapshot`):

- the module tree under the tuned module (identities) and each module's training flag;
- the parameters and buffers (identity, version counter, dtype, device);
- whether any forward/backward hook is registered on a submodule (or globally, `register_module_forward_hook`).

Per call, `stale()` costs one integer comparison (the module epoch, `module_epoch.EPOCH`, moved by every torch
method that changes structure, mode or hooks), four truth tests of torch's global hook tables (a global hook
registered through a name imported before the epoch's patches went in moved no epoch: a helper's script, sixth
round, whose hook doubled every block's output got the tuned graph's answers, unhooked) plus, only when some
backend baked the weights
(`Backend.bakes_weights`), one version-counter read per parameter and buffer: in-place edits are seen only there.
No tensor data is ever read.

When `stale()` says so, `review()` compares a fresh snapshot with the tuned one and says what the call may use
(`Verdict`):
- a hook on a submodule, or a training flag that differs from tune time: no backend may answer (the original
  module does), since no backend runs the submodules' hooks (a compiled graph was traced without them, an
  exported one has none) or the training-mode behaviour (dropout, batch-norm statistics updates);
- the module's structure differs from tune time (a submodule of another class where one was, a parameter or
  buffer of another shape, dtype or device: `.to(torch.bfloat16)`, `.cuda()`): a backend compiled for that
  structure (`Backend.compiled_for_structure`: everything but eager) no longer serves. Inductor would carry on
  only by recompiling inside the caller's call (dynamo's guards fail): seconds on the request path, and a graph
  no validation ever saw (measured: a BERT's first call after `.to(torch.bfloat16)` waited 4.9 s, after a Linear
  became a Sequential 1.8 s). The verdict names the change (`reshaped`) so that the owner can tune again: the
  JIT records the module anew (`GraphDispatcher`'s `on_outdated`); a wrapper without one answers with the
  original module until the structure is back;
- weights changed otherwise (in place, `load_state_dict`, a tensor or a submodule replaced by one of the same
  kind): a backend that reads the weights at call time (eager, Inductor) carries on; a backend that baked them
  is stale until `refit` (see `refit.py`) succeeds; until then the original module answers its calls.

The verdict stays cached until the epoch or a version counter moves again, so a model that keeps a hook for a
while pays a few attribute reads per call, not a tree walk.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules import module as torch_module

from aitune_core.backends import module_epoch, tensor_swaps
from aitune_core.backends.inert_hooks import counted
from aitune_core.forward_slot import SlotForward
from aitune_core.log import get_logger

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend

_logger = get_logger("dispatch")

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_DICTS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                      "_global_backward_pre_hooks")
_snapshots: weakref.WeakSet[ModuleSnapshot] = weakref.WeakSet()  # (live snapshots: `forget_tensors`)
# torch's global hook tables (created once, changed in place): a hook registered through a name the program imported
# before the epoch's patches were installed moves no epoch, so `stale` looks at their sizes too
_FORWARD, _FORWARD_PRE, _BACKWARD, _BACKWARD_PRE = (getattr(torch_module, name) for name in _GLOBAL_HOOK_DICTS)


def global_hook_total() -> int:
    """How many global module hooks are registered (every kind, inert ones included)."""
    return len(_FORWARD) + len(_FORWARD_PRE) + len(_BACKWARD) + len(_BACKWARD_PRE)


def submodule_hooks(module: torch.nn.Module) -> int:
    """Forward/backward hooks registered on the submodules of `module` (not on `module` itself: those fire
    around the tuned forward) plus the global module hooks. Probes and backends never run them. A library's hooks
    that do nothing unless it collects through them are not counted (`inert_hooks`)."""
    count = sum(counted(getattr(torch_module, name, {})) for name in _GLOBAL_HOOK_DICTS)
    for sub in module.modules():
        if sub is module:
            continue
        state = sub.__dict__
        for name in _HOOK_DICTS:
            hooks = state.get(name)
            if hooks:
                count += counted(hooks)
    return count


def _same_objects(refs: tuple[weakref.ref, ...], others: tuple[weakref.ref, ...]) -> bool:
    return len(refs) == len(others) and all(
        (obj := a()) is not None and obj is b() for a, b in zip(refs, others)
    )


def _dead() -> None:
    return None


_DEAD: Any = _dead  # (a reference whose tensor is gone: `_same_objects` reads it as changed)


def forget_tensors(*tensors: torch.Tensor) -> None:
    """Every snapshot lets go of these tensors, and compares as changed from now on (`tensor_swaps`: a tensor
    swapped in place is another tensor behind the same object)."""
    ids = {id(t) for t in tensors}
    for snapshot in list(_snapshots):
        snapshot._forget(ids)


@dataclass(frozen=True, eq=False)
class ModuleSnapshot:
    """The state of a module tree that tuned backends depend on. Modules and tensors are held by weak reference
    (a snapshot must not keep replaced weights alive); a dead reference compares as changed."""

    modules: tuple[weakref.ref, ...]
    training: tuple[bool, ...]
    tensors: tuple[weakref.ref, ...]
    versions: tuple[int, ...]
    layouts: tuple[tuple[torch.dtype, torch.device], ...]
    hooks: int
    types: tuple[type, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()
    values: tuple[tuple[tuple[str, object], ...], ...] = ()
    tensor_types: tuple[type, ...] = ()  # a weight swapped for a tensor subclass (torchao's `quantize_`)
    forwards: tuple[tuple[int, int] | None, ...] = ()  # instance forwards (accelerate's hooks, a monkeypatch)
    names: tuple[str, ...] = ()  # the submodules' qualified names, in `types`' order (to say what changed)

    @classmethod
    def take(cls, module: torch.nn.Module) -> ModuleSnapshot:
        tensor_swaps.install(forget_tensors)  # (its weak references must not stop `torch.utils.swap_tensors`)
        named = tuple(module.named_modules())
        modules = tuple(sub for _name, sub in named)
        tensors = tuple([*module.parameters(), *module.buffers()])
        snapshot = cls(
            modules=tuple(weakref.ref(m) for m in modules),
            training=tuple(m.training for m in modules),
            tensors=tuple(weakref.ref(t) for t in tensors),
            versions=tuple(t._version for t in tensors),
            layouts=tuple((t.dtype, t.device) for t in tensors),
            hooks=submodule_hooks(module),
            values=tuple(_plain_values(m) for m in modules),
            types=tuple(type(m) for m in modules),
            shapes=tuple(tuple(t.shape) for t in tensors),
            tensor_types=tuple(type(t) for t in tensors),
            forwards=tuple(_instance_forward(m) for m in modules),
            names=tuple(name for name, _sub in named),
        )
        _snapshots.add(snapshot)
        return snapshot

    def _forget(self, ids: set[int]) -> None:
        """Replace the references to tensors of these ids by dead ones: the snapshot compares as changed."""
        if any(id(ref()) in ids for ref in self.tensors):
            object.__setattr__(self, "tensors", tuple(_DEAD if id(ref()) in ids else ref for ref in self.tensors))

    def live_tensors(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(ref() for ref in self.tensors)

    def same_tree(self, other: ModuleSnapshot) -> bool:
        return _same_objects(self.modules, other.modules)

    def same_weights(self, other: ModuleSnapshot) -> bool:
        """Same tree, same tensors (identity), unchanged values (version counters), same dtypes and devices, and
        the same plain values (`eps`: an exported graph holds those as constants too)."""
        return (
            self.same_tree(other)
            and _same_objects(self.tensors, other.tensors)
            and self.versions == other.versions
            and self.layouts == other.layouts
            and self.values == other.values
        )


    def reshape_from(self, tuned: ModuleSnapshot) -> str | None:
        """What makes this structure another than `tuned`'s (the classes of the submodules, the shapes, dtypes and
        devices of the parameters and buffers), in words; None when it is the same."""
        if self.types != tuned.types:
            return _tree_change(tuned, self)
        if self.shapes != tuned.shapes:
            return "a parameter or buffer changed shape"
        if self.layouts != tuned.layouts:
            return _layout_change(tuned.layouts, self.layouts)
        if self.tensor_types != tuned.tensor_types:
            changed = sorted({f"{a.__name__} -> {b.__name__}" for a, b in zip(tuned.tensor_types, self.tensor_types)
                              if a is not b})
            return f"a parameter or buffer became another tensor type ({', '.join(changed)})"
        return None


def _tree_change(then: ModuleSnapshot, now: ModuleSnapshot) -> str:
    """What differs between two trees' submodules, by qualified name: added, removed, or of another class (compared
    by position, an appended layer was named as every later module changing class: "layers.2: ParameterList ->
    Linear" after `layers.append(...)`, in a helper's script, sixth round)."""
    before, after = dict(zip(then.names, then.types)), dict(zip(now.names, now.types))
    changed = [f"{name or 'the module itself'}: {before[name].__name__} -> {cls.__name__}"
               for name, cls in after.items() if name in before and before[name] is not cls]
    if changed:
        return f"a submodule changed class ({changed[0]})"
    added = [f"{name}: {cls.__name__}" for name, cls in after.items() if name not in before]
    removed = [name for name in before if name not in after]
    if added or removed:
        parts = ([f"added {', '.join(added[:3])}{' ...' if len(added) > 3 else ''}"] if added else []) + (
            [f"removed {', '.join(removed[:3])}{' ...' if len(removed) > 3 else ''}"] if removed else [])
        return f"its submodules changed ({'; '.join(parts)})"
    return f"its submodules changed ({len(then.types)} -> {len(now.types)} modules)"


def _layout_change(
    then: tuple[tuple[torch.dtype, torch.device], ...], now: tuple[tuple[torch.dtype, torch.device], ...]
) -> str:
    """`its dtypes changed (torch.float32 -> torch.bfloat16)` and / or `its devices changed (cpu -> cuda:0)`."""
    dtypes = sorted({f"{a[0]} -> {b[0]}" for a, b in zip(then, now) if a[0] != b[0]})
    devices = sorted({f"{a[1]} -> {b[1]}" for a, b in zip(then, now) if a[1] != b[1]})
    parts = [f"its dtypes changed ({', '.join(dtypes)})"] if dtypes else []
    if devices:
        parts.append(f"its devices changed ({', '.join(devices)})")
    return " and ".join(parts)


def _instance_forward(module: torch.nn.Module) -> tuple[int, int] | None:
    """The identity of a `forward` set on the module instance (not aitune's own slot), None without one. Why: a
    forward replaced after tuning (accelerate's `add_hook_to_module`, diffusers' hook registry, a monkeypatch)
    changes what the module computes; the compiled graph's guards fail on it and dynamo recompiled it inside the
    program's call, unvalidated (a forward that draws random numbers then drew them from Inductor's generator)."""
    forward = vars(module).get("forward")
    if forward is None or isinstance(forward, SlotForward):
        return None
    return (id(forward), id(getattr(forward, "__func__", forward)))


def _plain_values(module: torch.nn.Module) -> tuple[tuple[str, object], ...]:
    """A module's public plain attributes (numbers, strings, flags; `training` apart), by name."""
    return tuple(sorted((name, value) for name, value in vars(module).items()
                        if type(value) in module_epoch.PLAIN and not name.startswith("_") and name != "training"))


@dataclass
class Verdict:
    """What the backends may do now: `divert` names why the original module answers every call (None: the
    backends may serve); `blocked` are the baked-weight backends still waiting for a refit, and backends compiled
    for a structure the module no longer has; `reshaped` says how the structure differs from tune time (None:
    it does not)."""

    divert: str | None = None
    blocked: frozenset[int] = field(default_factory=frozenset)  # id(backend)
    reshaped: str | None = None

    @property
    def clean(self) -> bool:
        return self.divert is None and not self.blocked


class ModuleWatch:
    """Watches one tuned module for the backends in `backends` (see the module docstring)."""

    __slots__ = ("__weakref__", "_baked", "_baselines", "_epoch", "_globals", "_module_ref", "_noted", "_seen",
                 "_shaped", "_tree_ids", "_tuned", "_verdict", "_versions", "name")

    def __init__(
        self, module: torch.nn.Module, backends: Iterable[Backend], name: str = "", previous: ModuleWatch | None = None,
        hooks_at_tune: int | None = None,
    ) -> None:
        """`previous`: the watch this one replaces (the same module with backends added or dropped): backends it
        tracked keep the weights they were built or last refit with, so a backend still waiting for its refit is
        not taken for fresh; the tune-time training flags carry over too. `hooks_at_tune`: the submodule hooks
        (`submodule_hooks`) when the backends' tuning began, where the owner knows it: a different count now means
        hooks came or went while they were built."""
        module_epoch.acquire()  # first, so that a change made while the snapshot is taken moves the epoch
        weakref.finalize(self, module_epoch.release)
        self._tree_ids: list[int] = module_epoch.watch_tree(list(module.modules()))  # (before the snapshot too)
        weakref.finalize(self, module_epoch.unwatch_tree, self._tree_ids)
        self._seen = module_epoch.EPOCH.value
        self._epoch = self._seen
        self._globals = global_hook_total()
        self._module_ref = weakref.ref(module)
        self.name = name
        current = ModuleSnapshot.take(module)
        self._tuned = previous._tuned if previous is not None else current
        backends = list(backends)
        self._baked = [b for b in backends if b.bakes_weights]
        # backends that serve only the structure of tune time (a backend that pins its output dtypes does too)
        self._shaped = [b for b in backends
                        if getattr(b, "compiled_for_structure", False) or getattr(b, "pins_output_dtypes", False)]
        # per baked backend, the snapshot of the weights it holds now
        inherited = previous._baselines if previous is not None else {}
        self._baselines: dict[int, ModuleSnapshot] = {id(b): inherited.get(id(b), current) for b in self._baked}
        if any(not baseline.same_weights(current) for baseline in self._baselines.values()) or (
            previous is not None and current.reshape_from(self._tuned) is not None
        ) or (hooks_at_tune is not None and current.hooks != hooks_at_tune):
            # a backend still needs its refit, the structure is not the tuned one, or hooks came or went while the
            # backends were built (a hook registered while a background job compiled: before this watch, and the
            # process's first tuning has no epoch patches to see it - a helper's script got the tuned graph's
            # answers, unhooked, for 879 of 1600 calls; hooks there all along were traced into the graph, as an
            # AOT tune of a hooked module is): the first call reviews in full
            self._epoch = self._seen = -1
        self._verdict = Verdict()
        self._noted: set[str] = set()
        self._versions: tuple[tuple[torch.Tensor, int], ...] = (
            tuple(zip(current.live_tensors(), current.versions)) if self._baked else ()
        )
        if self._baked:  # an exported graph holds plain values as constants: their changes move the epoch
            modules = list(module.modules())
            module_epoch.watch_values(modules)
            weakref.finalize(self, module_epoch.unwatch_values, [id(m) for m in modules])

    # ------------------------------------------------------------------ per call
    def stale(self) -> bool:
        """True when something may have changed since the last review (or the last verdict was not clean)."""
        if self._epoch != module_epoch.EPOCH.value:
            return True
        if (_FORWARD or _FORWARD_PRE or _BACKWARD or _BACKWARD_PRE or self._globals) and (
                global_hook_total() != self._globals):
            return True
        for tensor, version in self._versions:  # noqa: SIM110 - a plain loop: no generator on every call
            if tensor._version != version:
                return True
        return False

    # ------------------------------------------------------------------ slow path
    def review(self, refit: Callable[[Backend], bool], *, refit_reshaped: bool = True) -> Verdict:
        """Compare the module with its tuned state; refit stale baked backends (`refit(backend)` -> success).
        `refit_reshaped=False`: after a change of structure, block the baked backends instead of rebuilding them on
        this thread (an owner that tunes the module again anyway)."""
        now = module_epoch.EPOCH.value
        hooks = global_hook_total()
        if now == self._seen and hooks == self._globals and not self._versions_moved():
            return self._verdict  # nothing moved since the last review
        module = self._module_ref()
        if module is None:
            return Verdict(divert="the module is gone")
        self._watch_tree(module)
        current = ModuleSnapshot.take(module)
        divert = self._divert_reason(current)
        reshaped = current.reshape_from(self._tuned)
        blocked: set[int] = set()
        for backend in self._baked:
            key = id(backend)
            if self._baselines[key].same_weights(current):
                continue
            # never refit while hooks could be traced into the rebuild
            if divert is None and (reshaped is None or refit_reshaped) and refit(backend):
                self._baselines[key] = current
                self._note(f"refit-{key}", f"{backend.describe()} refit to the module's current weights")
            else:
                blocked.add(key)
        if reshaped is not None:
            for backend in self._shaped:
                if id(backend) not in self._baselines or id(backend) in blocked:
                    blocked.add(id(backend))
                    self._note(f"reshaped-{id(backend)}", f"{backend.describe()} was compiled for the module as it "
                               f"was tuned, and {reshaped}: the original module answers its calls"
                               + ("" if not refit_reshaped else " until it is tuned again or changed back"),
                               logging.INFO if not refit_reshaped else logging.WARNING)
        self._verdict = Verdict(divert=divert, blocked=frozenset(blocked), reshaped=reshaped)
        if divert is not None:
            self._note(divert, f"the original module answers while {divert}")
        self._seen, self._globals = now, hooks
        self._versions = tuple(zip(current.live_tensors(), current.versions)) if self._baked else ()
        self._epoch = now if self._verdict.clean else -1
        return self._verdict

    def _watch_tree(self, module: torch.nn.Module) -> None:
        """Watch the tree as it is now (new submodules first, then the old ids go), in the same list object that
        the finalizer holds."""
        fresh = module_epoch.watch_tree(list(module.modules()))
        module_epoch.unwatch_tree(list(self._tree_ids))
        self._tree_ids[:] = fresh

    def _versions_moved(self) -> bool:
        return any(tensor._version != version for tensor, version in self._versions)

    def _divert_reason(self, current: ModuleSnapshot) -> str | None:
        if current.hooks:
            return "hooks are registered on its submodules (or globally)"
        if current.forwards[1:] != self._tuned.forwards[1:] and current.same_tree(self._tuned):
            # (the module's own: a wrapper around aitune's slot, as accelerate's hook on the root sets, still reaches
            # the tuned graph through it)
            return "a submodule's forward was replaced since tuning (an instance `forward`, as accelerate's hooks set)"
        tuned = self._tuned
        if current.same_tree(tuned):
            if current.training != tuned.training:
                return "a training flag differs from tune time"
        elif any(current.training) != any(tuned.training):
            return "a training flag differs from tune time"
        return None

    def _note(self, key: str, message: str, level: int = logging.INFO) -> None:
        if key not in self._noted:
            self._noted.add(key)
            _logger.log(level, "Module `%s`: %s", self.name, message)
