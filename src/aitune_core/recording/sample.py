"""`Sample`: one recorded call: the inputs as the caller passed them and the original module's output.

A sample owns everything it holds: tensors are detached clones, and any other object (a KV cache, a config, a
scheduler) is a deep copy taken when the call is recorded. Tuning replays samples many times (graph-break probe,
warm-up, validation, timing); replaying on the caller's live objects would change the program's state.

A call that changes its arguments (a decoder appending to its KV cache) is a *stateful* sample: its inputs are
copied before the call ran (`owned_inputs`), and `inputs_after` holds the state the original forward left them in,
captured with the output in one deep copy so that an output which *is* an argument object (the cache returned with
the logits) stays that object. Such a sample can be replayed any number of times only on fresh copies, so
`inputs_to` gives a new copy of every argument on each call for it; validation compares what a backend leaves in
its copy with `inputs_after`.
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


def owned_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Copies of a call's arguments as they are now (tensors cloned, objects deep-copied, one memo), for a stateful
    call before its forward runs. Raises `NotReplayableError` when an argument object cannot be copied."""
    memo: dict[int, Any] = {}
    return tuple(_owned(tuple(args), memo, strict=True)), dict(_owned(dict(kwargs), memo, strict=True))


@dataclass
class Sample:
    """One call of a module.

    - `args`, `kwargs`: as the caller passed them (tensors detached and cloned when captured).
    - `output`: the original module's output for this call (detached, cloned): the reference a
      backend's output is validated against.
    - `batch_size`: from the global context when known (AOT), else None.
    - `mutates_inputs`: the original forward changed its arguments during this call (a stateful sample);
      `inputs_after`: `(args, kwargs)` as it left them (see the module docstring).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    batch_size: int | None = None
    mutates_inputs: bool = False
    inputs_after: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    @classmethod
    def capture(
        cls,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any = None,
        batch_size: int | None = None,
        *,
        after: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
    ) -> Sample:
        """A sample that owns copies of every tensor and object, so it cannot change after the call.

        `after`: for a call that changed its arguments, `(args, kwargs)` as the forward left them (`args` /
        `kwargs` must then be what they were before the call, e.g. `owned_inputs` taken before it); the sample
        is stateful. Raises `NotReplayableError` when an input object cannot be copied (an output object that
        cannot be copied is kept by reference: outputs are compared, never replayed).
        """
        memo: dict[int, Any] = {}
        owned_args = tuple(_owned(tuple(args), memo, strict=True))
        owned_kwargs = dict(_owned(dict(kwargs), memo, strict=True))
        if after is None:
            return cls(args=owned_args, kwargs=owned_kwargs, output=_owned(output, {}, strict=False),
                       batch_size=batch_size)
        # one memo for the output and the state left behind: a returned argument object stays that object
        owned_output, after_args, after_kwargs = _owned((output, tuple(after[0]), dict(after[1])), {}, strict=True)
        return cls(args=owned_args, kwargs=owned_kwargs, output=owned_output, batch_size=batch_size,
                   mutates_inputs=True, inputs_after=(tuple(after_args), dict(after_kwargs)))

    def map_tensors(self, fn: Callable[[torch.Tensor], Any]) -> Sample:
        """A new sample with `fn` applied to every tensor of args, kwargs and output (and the state left behind)."""
        return Sample(
            args=tuple(tree_map(fn, tuple(self.args))),
            kwargs=dict(tree_map(fn, dict(self.kwargs))),
            output=tree_map(fn, self.output),
            batch_size=self.batch_size,
            mutates_inputs=self.mutates_inputs,
            inputs_after=None if self.inputs_after is None else tree_map(fn, self.inputs_after),
        )

    def to(self, device: torch.device | str) -> Sample:
        """A copy with every tensor moved to `device`."""
        return self.map_tensors(lambda t: t.to(device))

    def inputs_to(self, device: torch.device | str | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Only the inputs, placed for a backend on `device` as the caller placed them (`replay_device`).

        For a stateful sample every call gives new copies of every argument (a replay changes them).
        """

        def place(t: torch.Tensor) -> torch.Tensor:
            return t.to(replay_device(t, device))

        if self.mutates_inputs:
            args, kwargs = owned_inputs(self.args, self.kwargs)
            return tuple(tree_map(place, args)), dict(tree_map(place, kwargs))
        return tuple(tree_map(place, tuple(self.args))), dict(tree_map(place, dict(self.kwargs)))

    def run(self, fn: Callable[..., Any]) -> Any:
        """`fn(*args, **kwargs)` with this sample's inputs."""
        return fn(*self.args, **self.kwargs)
