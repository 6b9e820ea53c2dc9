"""`batch_probes`: calls at the batch sizes of a graph's tuned range that its recorded calls did not show.

Why: a graph tuned over a batch range (the recorded sizes widened by `specs/range_headroom.py`) is compiled from
its recorded calls, and torch specializes where the model's operators branch on a size: on the CPU a small CNN
served over batch 1..32 was compiled for 1 and for 16..32 only (the convolution's implementation depends on the
batch). A serving call at batch 4, inside the tuned range, was then compiled on the serving thread and waited
3 s. Calling the backend at the range's ends and at the powers of two between them while it is built (on the
worker's thread) compiles those specializations before any request needs them.

The calls are made from the largest recorded call: its tensors with a batch axis are cut down (`narrow`) or
repeated along that axis to each size. Only graphs with one batch axis name are probed (its tensors share it),
and never with calls that change their arguments (a cache cut to another batch would be a different state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.specs.tensor_spec import is_batch_axis
from aitune_core.specs.tree import flatten_values, unflatten

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec


def probe_sizes(low: int, high: int, recorded: set[int]) -> list[int]:
    """The range's ends and the powers of two strictly between them, less the sizes already recorded."""
    sizes = {low, high}
    power = 2
    while power < high:
        if power > low:
            sizes.add(power)
        power *= 2
    return sorted(sizes - recorded)


def _resized(tensor: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    have = tensor.shape[axis]
    if size > have:
        tensor = torch.cat([tensor] * (-(-size // have)), dim=axis)
    return tensor.narrow(axis, 0, size).contiguous()


def batch_probes(
    graph_spec: GraphSpec, data: Sequence[Sample], device: torch.device | None
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(args, kwargs) per batch size to compile beforehand (see the module docstring); empty when there is none."""
    specs = graph_spec.input_spec.tensors
    axes = {(index, axis): spec.shape[axis] for index, spec in enumerate(specs) for axis in spec.non_static_axes()
            if is_batch_axis(spec.shape[axis])}
    names = set(axes.values())
    usable = [sample for sample in data if not getattr(sample, "mutates_inputs", False)]
    if len(names) != 1 or not usable:
        return []
    first = next(iter(axes))
    low, high = specs[first[0]].min_shape[first[1]], specs[first[0]].max_shape[first[1]]
    if high <= low:
        return []
    base = max(usable, key=lambda s: sum(t.numel() for t in graph_spec.input_tensors(s.args, s.kwargs)))
    recorded = {int(graph_spec.input_tensors(s.args, s.kwargs)[first[0]].shape[first[1]]) for s in usable}
    args, kwargs = base.inputs_to(device) if device is not None else (base.args, base.kwargs)
    # the call is rebuilt from the base sample's own leaves: its non-tensor values are that call's (a free scalar's
    # value is not in the spec: `free_scalars`)
    leaves, treedef = flatten_values(graph_spec.bind(args, kwargs))
    places = [place for place, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[place] for place in places]
    calls = []
    for size in probe_sizes(low, high, recorded):
        resized = list(leaves)
        for index, axis in axes:
            resized[places[index]] = _resized(tensors[index], axis, size)
        new_args, new_kwargs = graph_spec.binder.unbind(unflatten(treedef, resized))
        calls.append((tuple(new_args), dict(new_kwargs)))
    return calls
