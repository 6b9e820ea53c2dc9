"""`Sample`: one recorded call: the inputs as the caller passed them and the original module's output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from aitune_core.specs.tree import tree_map


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    # detach: no autograd history is kept alive; clone: a later in-place change by the user cannot
    # alter the recorded values.
    return tensor.detach().clone()


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
        """A sample that owns copies of every tensor, so it cannot change after the call."""
        return cls(
            args=tuple(tree_map(_snapshot, tuple(args))),
            kwargs=dict(tree_map(_snapshot, dict(kwargs))),
            output=tree_map(_snapshot, output),
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
        """Only the inputs, moved to `device` (what a backend needs to run the sample)."""
        return tuple(tree_map(lambda t: t.to(device), tuple(self.args))), dict(
            tree_map(lambda t: t.to(device), dict(self.kwargs))
        )

    def run(self, fn: Callable[..., Any]) -> Any:
        """`fn(*args, **kwargs)` with this sample's inputs."""
        return fn(*self.args, **self.kwargs)
