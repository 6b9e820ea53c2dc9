"""`Sample`: one recorded call: the inputs as the caller passed them and the original module's output.

A sample owns everything it holds: tensors are detached clones, and any other object (a KV cache, a config, a
scheduler) is a deep copy taken when the call is recorded. Tuning replays samples many times (graph-break probe,
warm-up, validation, timing); replaying on the caller's live objects would change the program's state.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from aitune_core.errors import NotReplayableError
from aitune_core.specs.tree import flatten_values, tree_map, unflatten

_SHARED = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum)


def replay_device(tensor: torch.Tensor, device: torch.device | str | None) -> torch.device:
    """Where a recorded tensor goes when its call is replayed for a backend on `device`: where the caller had it,
    when that is `device`'s type or the CPU, else `device`.

    Replays must call the module the way the program does: a diffusers scheduler passes its timestep as a CPU
    tensor to a CUDA UNet, and a compiled graph warmed up and validated with that timestep on the GPU is not the
    graph the program's calls run (dynamo guards on devices: the first real call compiled again, for minutes, and
    ran code no validation had seen). Only a tensor recorded on another accelerator type moves.
    """
    if device is None:
        return tensor.device
    target = torch.device(device)
    if tensor.device.type in ("cpu", target.type):
        return tensor.device
    return target


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    # detach: no autograd history is kept alive; clone: a later in-place change by the user cannot
    # alter the recorded values.
    return tensor.detach().clone()


def _owned(value: Any, memo: dict[int, Any], *, strict: bool) -> Any:
    """`value` with every tensor cloned and every other object deep-copied (one memo: shared objects stay shared).

    Immutable constants and modules are shared (a module argument is code and weights, not call state). With
    `strict`, an object that cannot be copied raises `NotReplayableError`; otherwise it is kept by reference.
    """
    values, treedef = flatten_values(value)
    if not values:
        return tree_map(_snapshot, value)
    owned = []
    for leaf in values:
        if isinstance(leaf, torch.Tensor):
            owned.append(_snapshot(leaf))
        elif isinstance(leaf, (*_SHARED, torch.nn.Module)) or callable(leaf):
            owned.append(leaf)
        else:
            try:
                owned.append(copy.deepcopy(leaf, memo))
            except Exception as exc:
                if strict:
                    raise NotReplayableError(
                        f"an argument of type {type(leaf).__name__} cannot be copied for replaying "
                        f"({type(exc).__name__}: {exc})"
                    ) from exc
                owned.append(leaf)
    return unflatten(treedef, owned)


@dataclass
class Sample:
    """One call of a module.

    - `args`, `kwargs`: as the caller passed them (tensors detached and cloned when captured).
    - `output`: the original module's output for this call (detached, cloned): the reference a
      backend's output is validated against.
    - `batch_size`: from the global context when known (AOT), else None.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    batch_size: int | None = None

    @classmethod
    def capture(
        cls, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any = None, batch_size: int | None = None
    ) -> Sample:
        """A sample that owns copies of every tensor and object, so it cannot change after the call.

        Raises `NotReplayableError` when an input object cannot be copied (an output object that cannot be
        copied is kept by reference: outputs are compared, never replayed).
        """
        memo: dict[int, Any] = {}
        return cls(
            args=tuple(_owned(tuple(args), memo, strict=True)),
            kwargs=dict(_owned(dict(kwargs), memo, strict=True)),
            output=_owned(output, {}, strict=False),
            batch_size=batch_size,
        )

    def map_tensors(self, fn: Callable[[torch.Tensor], Any]) -> Sample:
        """A new sample with `fn` applied to every tensor of args, kwargs and output."""
        return Sample(
            args=tuple(tree_map(fn, tuple(self.args))),
            kwargs=dict(tree_map(fn, dict(self.kwargs))),
            output=tree_map(fn, self.output),
            batch_size=self.batch_size,
        )

    def to(self, device: torch.device | str) -> Sample:
        """A copy with every tensor moved to `device`."""
        return self.map_tensors(lambda t: t.to(device))

    def inputs_to(self, device: torch.device | str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Only the inputs, placed for a backend on `device` as the caller placed them (`replay_device`)."""

        def place(t: torch.Tensor) -> torch.Tensor:
            return t.to(replay_device(t, device))

        return tuple(tree_map(place, tuple(self.args))), dict(tree_map(place, dict(self.kwargs)))

    def run(self, fn: Callable[..., Any]) -> Any:
        """`fn(*args, **kwargs)` with this sample's inputs."""
        return fn(*self.args, **self.kwargs)
