"""`ModuleEffects`: what one call of a module did to the module itself and to the process's random streams.

Why it exists: tuning replays recorded calls on the program's own module (the eager timings, a compile's
warm-up, validation). `ArgumentWatch` covers what a forward does to its arguments; this covers the rest of what
a replay would do again:

- the module's tensors: a forward that writes its buffers (a step counter, running statistics, a ring buffer of
  past outputs) or rebinds them would see every replay as one more step;
- its plain Python attributes: a forward that counts its calls or appends to a list attribute;
- the random streams (torch's default CPU generator, the current CUDA device's, Python's `random`, numpy's global
  stream; generators kept in its attributes count through their fingerprints, `rng_state`): a forward that draws
  noise (`torch.randn_like`, dropout) would take numbers that the program's later draws would have had.

Measured with scripts a user could write (this CPU, 2026-11-26): a buffer counter read 114 after two calls
instead of 2, a call counter went backwards, and the program's own `torch.rand` values changed after tuning.
Such a module is not replayed, so it is not tuned (its children still can be).

`ModuleEffects.before(module)` takes the fingerprint (tensors by identity and version counter, no data read;
attributes by value for simple values, and three levels into containers and plain objects: the tensors and values a
dict, list or namespace attribute holds (`value_fingerprint`); the random states by value); `changes()`, after the
call, names the first difference, or returns None. Attributes that torch or aitune keep on a module (its parameter,
buffer, submodule and hook tables, aitune's node slot and forward wrapper) are not the forward's doing and are left
out.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.recording.rng_state import numpy_global_state
from aitune_core.recording.value_fingerprint import contents_fingerprint, tensor_fingerprint

#: levels looked into a module attribute (`value_fingerprint.contents_fingerprint`): a dict of lists of tensors, a
#: namespace of namespaces holding a counter (3 since the twenty-fifth session: a watch of a tiny BERT or LLaMA
#: took 1.9 ms at 2 and at 3 on this CPU)
ATTRIBUTE_DEPTH = 3

#: a module's own bookkeeping, not state its forward keeps (the tensors are fingerprinted through their tables)
_BOOKKEEPING = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "forward",
                          "_compiled_call_impl"})


def _is_bookkeeping(key: str) -> bool:
    return key in _BOOKKEEPING or "hook" in key or key.startswith("_aitune")


def _module_state(module: torch.nn.Module) -> dict[tuple[str, str], Any]:
    state: dict[tuple[str, str], Any] = {}
    memo: dict[int, Any] = {}
    for name, sub in module.named_modules(remove_duplicate=True):
        for key, value in vars(sub).items():
            if not _is_bookkeeping(key):
                state[(name, key)] = contents_fingerprint(value, ATTRIBUTE_DEPTH, memo, unreadable=True)
        for table in ("_parameters", "_buffers"):
            for key, tensor in getattr(sub, table, {}).items():
                state[(name, key)] = tensor_fingerprint(tensor) if tensor is not None else None
    return state


def _random_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch's random generator": torch.default_generator.get_state(),
                              "Python's random module": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        with contextlib.suppress(Exception):  # (a device that cannot report it: nothing to compare)
            states["the CUDA random generator"] = torch.cuda.default_generators[torch.cuda.current_device()].get_state()
    numpy_state = numpy_global_state()
    if numpy_state is not None:
        states["numpy's global random state"] = numpy_state
    return states


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    return a == b


class ModuleEffects:
    """The fingerprint of `module` and the random streams before one call (see the module docstring)."""

    __slots__ = ("_module", "_random", "_state")

    def __init__(self, module: torch.nn.Module, state: dict[tuple[str, str], Any], randoms: dict[str, Any]) -> None:
        self._module = module
        self._state = state
        self._random = randoms

    @classmethod
    def before(cls, module: torch.nn.Module) -> ModuleEffects:
        return cls(module, _module_state(module), _random_states())

    def abandon(self) -> None:
        """Nothing to end (the call raised; `OutsideEffects` has a watch to end)."""

    def changes(self) -> str | None:
        """What the call changed, in words ("its attribute `calls`", "torch's random generator"), or None."""
        for source, state in _random_states().items():
            if source in self._random and not _same(self._random[source], state):
                return f"draws from {source}"
        now = _module_state(self._module)
        difference = first_difference(self._state, now)
        if difference is None:
            return None
        (name, key), removed = difference
        if removed:
            return f"removes its attribute `{_qualified(name, key)}`"
        return f"changes {_describe(name, key, now[(name, key)])}"


_MISSING = object()


def first_difference(before: dict[Any, Any], now: dict[Any, Any],
                     added: Callable[[Any], bool] | None = None) -> tuple[Any, bool] | None:
    """The first key whose fingerprint differs between two states, and whether it is gone; None when equal. A key
    new in `now` is a difference unless `added(key)` says it does not count."""
    for key, fingerprint in now.items():
        previous = before.get(key, _MISSING)
        if previous is _MISSING and added is not None and not added(key):
            continue
        if previous != fingerprint:
            return key, False
    for key in before.keys() - now.keys():
        return key, True
    return None


def _qualified(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


def _describe(name: str, key: str, fingerprint: Any) -> str:
    kind = fingerprint[0] if isinstance(fingerprint, tuple) else ""
    what = {"tensor": "tensor", "generator": "random generator"}.get(kind, "attribute")
    return f"its {what} `{_qualified(name, key)}`"
