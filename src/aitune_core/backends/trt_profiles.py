"""TensorRT optimization profiles derived from a GraphSpec (pure logic: no TensorRT import).

A TensorRT engine with dynamic input shapes needs, for every input, a `(min, opt, max)` shape triple: the engine
accepts any shape inside `[min, max]` axis by axis and picks its kernels for `opt`. Both TensorRT backends
(`TensorRTBackend` through ONNX, `TorchTensorRTBackend` through `torch_tensorrt.Input`) derive them here:

- `min` / `max`: the recorded extremes of each axis (`TensorSpec.min_shape` / `max_shape`), so the engine serves
  exactly the range that `GraphSpec.accepts` lets through to the backend;
- `opt`: the input shapes of the most frequent call among the recorded samples. The shapes of all inputs are
  taken from the same sample (as one combination), so related axes stay consistent, e.g. `input_ids` and
  `attention_mask` get the same sequence length. Ties go to the combination with more elements (the larger
  batch), since throughput matters most at large batches; without samples `opt` is `max`.

Static axes have `min == opt == max`. Profiles are plain dicts `{input name: ShapeRange}` in
`input_spec.tensors` order, JSON-serializable through `profiles_to_dict` / `profiles_from_dict` so a checkpoint can
record what the engine was built for.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeRange:
    """`(min, opt, max)` of one input; `min <= opt <= max` on every axis."""

    min: Shape
    opt: Shape
    max: Shape

    def __post_init__(self) -> None:
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError(f"ShapeRange: ranks differ: min {self.min}, opt {self.opt}, max {self.max}")
        for lo, opt, hi in zip(self.min, self.opt, self.max):
            if not 0 <= lo <= opt <= hi:
                raise ValueError(f"ShapeRange: needs 0 <= min <= opt <= max per axis; got {self.min}, {self.opt}, "
                                 f"{self.max}")

    @property
    def is_static(self) -> bool:
        return self.min == self.max

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.min) and all(lo <= s <= hi for s, lo, hi in zip(shape, self.min, self.max))

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[int]]) -> ShapeRange:
        return cls(tuple(int(v) for v in data["min"]), tuple(int(v) for v in data["opt"]),
                   tuple(int(v) for v in data["max"]))


def most_frequent_shapes(observed: Sequence[Sequence[Shape]]) -> tuple[Shape, ...] | None:
    """The most frequent combination of input shapes; ties go to the larger one (more elements), then the first seen.

    `observed` holds one entry per recorded call: the shapes of all its inputs, in input order.
    """
    if not observed:
        return None
    combos = [tuple(tuple(int(s) for s in shape) for shape in call) for call in observed]
    counts = Counter(combos)
    first_seen = {combo: index for index, combo in reversed(list(enumerate(combos)))}

    def rank(combo: tuple[Shape, ...]) -> tuple[int, int, int]:
        return counts[combo], sum(math.prod(shape) for shape in combo), -first_seen[combo]

    return max(counts, key=rank)


def derive_profiles(
    names: Sequence[str],
    min_shapes: Sequence[Shape],
    max_shapes: Sequence[Shape],
    observed: Sequence[Sequence[Shape]] = (),
) -> dict[str, ShapeRange]:
    """`{name: ShapeRange}` from the recorded extremes and the observed calls (see the module docstring).

    An observed combination that does not fit the extremes (a rank mismatch or a size outside `[min, max]`) is a
    caller bug and raises ValueError rather than producing a profile the engine would reject.
    """
    if not len(names) == len(min_shapes) == len(max_shapes):
        raise ValueError(f"derive_profiles: {len(names)} names, {len(min_shapes)} min shapes, {len(max_shapes)} max "
                         "shapes")
    opt = most_frequent_shapes(observed)
    if opt is not None and len(opt) != len(names):
        raise ValueError(f"derive_profiles: an observed call has {len(opt)} inputs, expected {len(names)}")
    profiles: dict[str, ShapeRange] = {}
    for index, (name, lo, hi) in enumerate(zip(names, min_shapes, max_shapes)):
        lo, hi = tuple(int(s) for s in lo), tuple(int(s) for s in hi)
        best = opt[index] if opt is not None else hi
        if len(best) != len(lo) or not all(a <= s <= b for s, a, b in zip(best, lo, hi)):
            raise ValueError(f"derive_profiles: input {name!r}: observed shape {best} is outside the recorded range "
                             f"{lo}..{hi}")
        profiles[name] = ShapeRange(lo, best, hi)
    return profiles


def profiles_from_graph_spec(graph_spec: GraphSpec, data: Sequence[Sample] = ()) -> dict[str, ShapeRange]:
    """Profiles for every input tensor of `graph_spec`, `opt` from the most frequent shapes among `data`."""
    tensors = graph_spec.input_spec.tensors
    observed = [[tuple(t.shape) for t in graph_spec.input_tensors(s.args, s.kwargs)] for s in data]
    return derive_profiles(
        [t.name for t in tensors], [t.min_shape for t in tensors], [t.max_shape for t in tensors], observed
    )


def profiles_to_dict(profiles: Mapping[str, ShapeRange]) -> dict[str, Any]:
    return {name: profile.to_dict() for name, profile in profiles.items()}


def profiles_from_dict(data: Mapping[str, Any]) -> dict[str, ShapeRange]:
    return {name: ShapeRange.from_dict(value) for name, value in data.items()}
