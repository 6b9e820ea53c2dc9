"""Free scalars: an int or float argument whose value changes between the calls of one graph.

Why: in strict mode a non-tensor argument's value is part of a graph's identity, so `denoiser(x, t)` called with
the step `t` of a hand-written diffusion loop as a Python int made a graph per step: on this project's CPU a
20-step loop tuned 20 graphs, one Inductor compile each, where `torch.compile` compiles twice (its second compile
makes the int symbolic: dynamo's automatic dynamic). The same held for a float threshold or a scale that changes
per request. Now a call that differs from a recorded graph only in the values of int / float arguments belongs
to that graph, and those arguments become free in it: their recorded constant is replaced by a marker
(`FREE_INT`, `FREE_FLOAT`) that matches any value of that type. Bools, strings, None and other objects still
decide identity by value: they pick code paths.

A free scalar is a graph input whose value the backend must take from each call. Dynamo-compiled backends do
(its guards check what the trace assumed; a forward that indexes a list with the int specializes on each value,
which `scalar_specialization` finds in the warm-up). Backends that export a flat tensor graph bake constants in,
so they refuse a graph with a free scalar (`onnx_export.check_flat_graph`: the marker never equals a value).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from aitune_core.specs.sample_metadata import OpaqueConstant, SampleMetadata, constant_key, leaf_names
from aitune_core.specs.tree import TENSOR, TreeDef

FREE_INT = OpaqueConstant(("int",))
FREE_FLOAT = OpaqueConstant(("float",))
_MARKERS = {int: FREE_INT, float: FREE_FLOAT}
_FREE_KEYS = (FREE_INT.key, FREE_FLOAT.key)


def marker_for(value: Any) -> OpaqueConstant | None:
    """The free marker of an int or float value (never a bool), or None for any other value."""
    return _MARKERS.get(type(value))


def is_free(constant: Any) -> bool:
    """Whether a graph's recorded constant is a free marker."""
    return isinstance(constant, OpaqueConstant) and constant.key in _FREE_KEYS


def is_free_key(key: Hashable) -> bool:
    """Whether a constant's identity key (`constant_key`) is a free marker's."""
    return key in _FREE_KEYS


def loose_key(value: Any) -> Hashable:
    """`constant_key`, except that an int or float value gives its type's marker key (any value matches)."""
    marker = _MARKERS.get(type(value))
    return marker.key if marker is not None else constant_key(value)


def loose_identity(values: Sequence[Any], treedef: TreeDef) -> tuple[Any, ...]:
    """`call_identity(values, treedef, strict=True)` with every int / float leaf as its type only."""
    tensors = []
    consts = []
    for v in values:
        if isinstance(v, torch.Tensor):
            tensors.append((v.dim(), v.dtype))
        else:
            consts.append(loose_key(v))
    return (treedef, tuple(tensors), tuple(consts))


def freed(meta: SampleMetadata, values: Sequence[Any]) -> SampleMetadata | None:
    """`meta` with each int / float constant that differs from the call's leaf (`values`, flattened like `meta`)
    replaced by its free marker; None when the call differs nowhere (the caller checked that only such leaves can
    differ: equal `loose_identity`)."""
    leaves = [v for v in values if not isinstance(v, torch.Tensor)]
    constants = list(meta.constants)
    changed = False
    for position, ((locator, recorded), leaf) in enumerate(zip(constants, leaves)):
        if is_free(recorded) or constant_key(recorded) == constant_key(leaf):
            continue
        marker = marker_for(leaf)
        if marker is None or marker_for(recorded) is not marker:
            return None  # not a numeric difference: another graph
        constants[position] = (locator, marker)
        changed = True
    if not changed:
        return None
    return SampleMetadata(meta.tensors, meta.structure, tuple(constants))


def free_locators(meta: SampleMetadata) -> list[str]:
    """The free scalars' argument names (`t`, `kwargs_scale`), for messages."""
    names = [name for name, kind in zip(leaf_names(meta.structure), meta.structure.leaf_kinds()) if kind != TENSOR]
    return [name for name, (_locator, value) in zip(names, meta.constants) if is_free(value)]


def free_values(meta: SampleMetadata, values: Sequence[Any]) -> tuple[Any, ...]:
    """The values a call (flattened like `meta`) passes in the free scalars' places."""
    leaves = [v for v in values if not isinstance(v, torch.Tensor)]
    return tuple(leaf for (_locator, recorded), leaf in zip(meta.constants, leaves) if is_free(recorded))
