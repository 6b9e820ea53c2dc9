"""All-or-nothing checkpoint loading: record what a load changes in the model, undo all of it on failure.

`aitune.torch.load` first reads, verifies and builds everything without touching the model (see
`checkpoint_io`). What it then has to change (moving modules to a device, copying weights in, deploying
backends, wrapping modules, replacing attributes, routing wrappers to the loaded backends) runs inside a
`LoadTransaction`: when any step raises, `rollback()` gives the model back bit for bit as it was (the same
parameter and buffer objects, values and devices; no wrapper left; previous backends still in place).

The snapshot copies every parameter and buffer of the changed modules to the CPU, so a load needs that much
host memory for the time it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from aitune_aot.hooks_hidden import hooks_hidden
from aitune_aot.module import Module
from aitune_aot.registry import MODULE_REGISTRY
from aitune_core.backends.backend import Backend, BackendState

__all__ = ["LoadTransaction", "TensorSnapshot", "original_forward"]

_logger = logging.getLogger("aitune.aot.checkpoint")


@contextmanager
def original_forward(target: Module | torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The torch module of `target` (an aitune Module or a raw module) with its own forward and no forward hooks:
    what checkpoint loading builds and deploys backends on."""
    if isinstance(target, Module):
        with target._original_forward() as module:
            yield module
    else:
        with hooks_hidden(target):
            yield target


_ROUTING_FIELDS = (
    "_self_graphs", "_self_dispatcher", "_self_state", "_self_active", "_self_recorder", "_self_prev_recorder",
)


def _swap_graphs(wrapper: Module, graphs: list[tuple[Any, Backend]]) -> tuple[Any, ...]:
    """Route `wrapper` to checkpoint-loaded (deployed) backends; returns its previous routing state. The previous
    backends are left as they are (released by `LoadTransaction.commit`)."""
    previous = tuple(getattr(wrapper, name) for name in _ROUTING_FIELDS)
    wrapper._self_recorder = None
    wrapper._self_prev_recorder = None
    wrapper._install_backends(graphs)
    return previous


def _unswap_graphs(wrapper: Module, previous: tuple[Any, ...]) -> None:
    for name, value in zip(_ROUTING_FIELDS, previous, strict=True):
        setattr(wrapper, name, value)


class TensorSnapshot:
    """The parameters and buffers of some modules (objects, slots, values and devices), restorable exactly."""

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        self._slots: list[tuple[dict[str, Any], str, Any]] = []  # (module._parameters / _buffers, key, object)
        self._values: list[tuple[torch.Tensor, torch.Tensor, torch.device]] = []
        seen_modules: set[int] = set()
        seen_tensors: set[int] = set()
        for root in modules:
            for module in root.modules():
                if id(module) in seen_modules:
                    continue
                seen_modules.add(id(module))
                for slots in (module._parameters, module._buffers):
                    for key, tensor in slots.items():
                        self._slots.append((slots, key, tensor))
                        if tensor is not None and id(tensor) not in seen_tensors:
                            seen_tensors.add(id(tensor))
                            self._values.append((tensor, tensor.detach().to("cpu", copy=True), tensor.device))

    def restore(self) -> None:
        """Put every original tensor object back in its slot with its original value and device."""
        for slots, key, tensor in self._slots:
            slots[key] = tensor
        with torch.no_grad():
            for tensor, value, device in self._values:
                same = tensor.device == device and tensor.shape == value.shape and tensor.dtype == value.dtype
                if same:
                    tensor.copy_(value)
                else:
                    tensor.data = value.to(device)


class LoadTransaction:
    """Records the changes a load makes to the model so that `rollback()` can undo them in reverse order."""

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        self._snapshot = TensorSnapshot(modules)
        self._undo: list[Callable[[], None]] = []
        self._new_backends: list[Backend] = []
        self._replaced: list[list[tuple[Any, Backend]]] = []

    def deployed(self, backends: Iterable[Backend]) -> None:
        """Backends built by this load: released on rollback."""
        self._new_backends.extend(backends)

    def wrapped(self, wrapper: Module) -> None:
        """A wrapper this load created: its routing is removed and its name freed on rollback."""

        def unwrap() -> None:
            wrapper._self_slot.remove()
            MODULE_REGISTRY.unregister(wrapper.name)

        self._undo.append(unwrap)

    def set_attribute(self, parent: Any, name: str, value: Any) -> None:
        """`setattr(parent, name, value)`, undone on rollback."""
        had = name in getattr(parent, "_modules", {}) or hasattr(parent, name)
        previous = getattr(parent, name, None)
        setattr(parent, name, value)

        def restore() -> None:
            if had:
                setattr(parent, name, previous)
            else:
                delattr(parent, name)

        self._undo.append(restore)

    def swapped(self, wrapper: Module, graphs: list[tuple[Any, Backend]]) -> None:
        """Route `wrapper` to `graphs`; on rollback its previous state comes back, on commit its previous backends
        are released."""
        previous = _swap_graphs(wrapper, graphs)
        self._replaced.append(previous[0])
        self._undo.append(lambda: _unswap_graphs(wrapper, previous))

    def commit(self) -> None:
        """The load succeeded: release the backends the loaded ones replaced."""
        for graphs in self._replaced:
            for _spec, backend in graphs:
                if backend.state is BackendState.ACTIVE:
                    try:
                        backend.deactivate()
                    except Exception:  # releasing must never fail a load that succeeded
                        _logger.debug("Could not release %s", backend.describe(), exc_info=True)

    def rollback(self) -> None:
        """Undo every recorded change, newest first; then the weights and devices come back."""
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:  # keep undoing: the weights below matter most
                _logger.exception("Rolling back a failed checkpoint load: one step could not be undone")
        self._undo.clear()
        self._new_backends.clear()  # dropped: deployed checkpoint backends hold no resource beyond references
        Backend._free_memory()
        self._snapshot.restore()
