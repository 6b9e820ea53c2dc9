"""`TensorSpec`: one tensor of a graph's inputs or outputs: where it is, its name, shape range and dtype."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Axis = int | str


def is_batch_axis(axis: Axis) -> bool:
    return isinstance(axis, str) and axis.startswith("batch")


def is_dynamic_axis(axis: Axis) -> bool:
    return isinstance(axis, str) and not axis.startswith("batch")


def dtype_from_str(text: str) -> torch.dtype:
    """`"torch.float32"` or `"float32"` -> `torch.float32`."""
    name = text.split(".", 1)[1] if text.startswith("torch.") else text
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {text!r}")
    return dtype


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of a graph's inputs or outputs.

    `shape` holds an int for a static axis and a name for a varying one: `batchN` when the axis follows
    the batch size, `dimN` when it varies on its own (N is the axis index). `min_shape` / `max_shape`
    are the smallest and largest size seen on each axis (equal to `shape` on static axes).
    """

    locator: str
    name: str
    shape: tuple[Axis, ...]
    min_shape: tuple[int, ...]
    max_shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device | None = None

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, *, locator: str = "", name: str = "") -> TensorSpec:
        """A spec for one observation: every axis static."""
        shape = tuple(int(s) for s in tensor.shape)
        return cls(locator, name, shape, shape, shape, tensor.dtype, tensor.device)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def batch_axes(self) -> list[int]:
        """Indices of the axes that follow the batch size."""
        return [i for i, a in enumerate(self.shape) if is_batch_axis(a)]

    def dynamic_axes(self) -> list[int]:
        """Indices of the axes that vary independently of the batch size (`dimN`)."""
        return [i for i, a in enumerate(self.shape) if is_dynamic_axis(a)]

    def non_static_axes(self) -> list[int]:
        """Indices of every axis that is not a fixed int (batch and dynamic), in order."""
        return [i for i, a in enumerate(self.shape) if isinstance(a, str)]

    def is_static(self) -> bool:
        return not self.non_static_axes()

    def shape_in_range(self, shape: Sequence[int]) -> bool:
        """True when `shape` has this rank and each axis lies within [min, max] (equal on static axes)."""
        if len(shape) != len(self.shape):
            return False
        return all(lo <= s <= hi for s, lo, hi in zip(shape, self.min_shape, self.max_shape))

    def to_dict(self) -> dict[str, Any]:
        return {
            "locator": self.locator,
            "name": self.name,
            "shape": list(self.shape),
            "min_shape": list(self.min_shape),
            "max_shape": list(self.max_shape),
            "dtype": str(self.dtype),
            "device": None if self.device is None else str(self.device),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        device = data.get("device")
        return cls(
            locator=data["locator"],
            name=data["name"],
            shape=tuple(a if isinstance(a, str) else int(a) for a in data["shape"]),
            min_shape=tuple(int(a) for a in data["min_shape"]),
            max_shape=tuple(int(a) for a in data["max_shape"]),
            dtype=dtype_from_str(data["dtype"]),
            device=None if device is None else torch.device(device),
        )
