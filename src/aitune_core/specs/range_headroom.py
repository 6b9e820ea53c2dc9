"""`with_headroom(spec)`: a graph's varying axes widened to the powers of two around their recorded range.

Why: a JIT graph's ranges come from the few calls recorded before it was tuned (two, by default). A server whose
requests vary in length (a BERT classifier with sequence lengths 32..128) then sends most calls outside the tuned
range to the original module until the graph is tuned again - each time a compile. The backends that serve a
range (a dynamic Inductor graph, a TensorRT profile) run the same kernels for every size inside it, so a call
between two recorded sizes is trusted exactly as much as a size a little beyond them: recorded [35, 57] is
served as [32, 64], recorded [33, 120] as [32, 128]. Only axes that varied are widened (a batch of 8 seen every
time stays 8), axes that vary together keep their relation (`_shift`), a size of 1 is never added below a range
that does not hold it (dynamo specializes 1), and the recorded samples stay what the backend is validated on.
`jit_config.range_headroom = False` serves the recorded range only.
"""

from __future__ import annotations

from dataclasses import replace

from aitune_core.specs.graph_spec import GraphSpec
from aitune_core.specs.sample_metadata import SampleMetadata
from aitune_core.specs.tensor_spec import TensorSpec


def _floor_pow2(value: int) -> int:
    return 1 << (value.bit_length() - 1) if value > 0 else value


def _ceil_pow2(value: int) -> int:
    return 1 << (value - 1).bit_length() if value > 1 else value


def widened_bounds(low: int, high: int) -> tuple[int, int]:
    """The power-of-two bounds around [low, high]; unchanged when the axis did not vary."""
    if high <= low:
        return low, high
    new_low = low if low <= 1 else max(2, _floor_pow2(low))
    return new_low, max(high, _ceil_pow2(high))


_Pair = tuple[int, int]


def _varying(metadata: SampleMetadata, batch: bool) -> list[_Pair]:
    pairs = []
    for spec in metadata.tensors:
        for axis in spec.batch_axes() if batch else spec.dynamic_axes():
            if spec.max_shape[axis] > spec.min_shape[axis]:
                pairs.append((spec.min_shape[axis], spec.max_shape[axis]))
    return pairs


def _shift(pairs: list[_Pair]) -> tuple[int, int] | None:
    """How far down and up the ranges of one kind of axis move together, or None to leave them as recorded.

    Axes that vary together must keep their relation, or the widened ranges contradict each other (an input of
    length L and a mask of length L + 1 both widened to 32..64 would ask a backend for L = 64 with a mask of 64):
    equal ranges get the power-of-two bounds of that range; ranges of equal span (L and L + 1) move by the same
    amounts; anything else (L and 2 L) stays as recorded."""
    if not pairs or len({high - low for low, high in pairs}) != 1:
        return None
    low, high = pairs[0]
    new_low, new_high = widened_bounds(low, high)
    down = low - new_low
    for other_low, _high in pairs:  # never below 2 (dynamo specializes 1), nor below a recorded 0 or 1
        down = min(down, max(0, other_low - 2))
    return down, new_high - high


def _widened_tensor(spec: TensorSpec, shifts: dict[bool, tuple[int, int] | None]) -> TensorSpec:
    if spec.is_static():
        return spec
    low, high = list(spec.min_shape), list(spec.max_shape)
    for batch in (True, False):
        shift = shifts[batch]
        if shift is None:
            continue
        for axis in spec.batch_axes() if batch else spec.dynamic_axes():
            if high[axis] > low[axis]:
                low[axis], high[axis] = low[axis] - shift[0], high[axis] + shift[1]
    return replace(spec, min_shape=tuple(low), max_shape=tuple(high))


def with_headroom(spec: GraphSpec) -> GraphSpec:
    """`spec` with its varying input and output axes widened (see `_shift`; the same spec when nothing is).
    Name, structure, binder and strictness are kept, so dispatch and decision keys stay stable."""
    shifts = {batch: _shift(_varying(spec.input_spec, batch) + _varying(spec.output_spec, batch))
              for batch in (True, False)}
    inputs = spec.input_spec.with_tensors([_widened_tensor(t, shifts) for t in spec.input_spec.tensors])
    outputs = spec.output_spec.with_tensors([_widened_tensor(t, shifts) for t in spec.output_spec.tensors])
    if inputs == spec.input_spec and outputs == spec.output_spec:
        return spec
    return replace(spec, input_spec=inputs, output_spec=outputs)
