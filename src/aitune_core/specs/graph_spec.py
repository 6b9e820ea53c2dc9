"""`GraphSpec`: one computational graph of a module, i.e. one family of calls that a backend can serve.

Two calls belong to the same graph when their bound arguments have the same layout, the same tensor
ranks and dtypes, and (in strict mode) the same non-tensor values. Within a graph, tensor sizes vary
inside the recorded [min, max] range of each batch / dynamic axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from aitune_core.specs.binding import Binder
from aitune_core.specs.sample_metadata import SampleMetadata, constant_key
from aitune_core.specs.tree import TENSOR, flatten_values

# (leaf index, ndim, dtype, min shape, max shape): per input tensor, precomputed for `accepts`
_TensorCheck = tuple[int, int, torch.dtype, tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class GraphSpec:
    """A graph of a module: its name and the specs of its inputs (bound arguments) and outputs.

    - `name`: "0", "1", ... in order of first observation, so names are stable across processes.
    - `input_spec`: the bound arguments of forward (tensor names are parameter names, see `binding`).
    - `output_spec`: what the module returned (tensor names start with `outputs`).
    - `binder`: how `(args, kwargs)` map onto forward's parameters (from the module's signature).
    - `strict`: whether non-tensor input values are part of the identity (from `config.strict_mode`
      when the graph was recorded).
    """

    name: str
    input_spec: SampleMetadata
    output_spec: SampleMetadata
    binder: Binder = field(default_factory=Binder.generic)
    strict: bool = True
    _tensor_checks: tuple[_TensorCheck, ...] = field(init=False, repr=False, compare=False, hash=False)
    _const_checks: tuple[tuple[int, Any], ...] = field(init=False, repr=False, compare=False, hash=False)
    # arity of calls whose bound leaves are exactly their positional tensors, learned from the first such
    # accepted call: those calls skip binding and flattening (see `accepts`)
    _positional_arity: int | None = field(init=False, repr=False, compare=False, hash=False, default=None)

    def __post_init__(self) -> None:
        # Precompute everything `accepts` needs so the dispatch hot path does no spec walking.
        tensor_checks: list[_TensorCheck] = []
        const_checks: list[tuple[int, Any]] = []
        specs = iter(self.input_spec.tensors)
        consts = iter(self.input_spec.constants)
        for index, kind in enumerate(self.input_spec.structure.leaf_kinds()):
            if kind == TENSOR:
                spec = next(specs)
                tensor_checks.append((index, spec.ndim, spec.dtype, spec.min_shape, spec.max_shape))
            else:
                _locator, value = next(consts)
                const_checks.append((index, constant_key(value)))
        object.__setattr__(self, "_tensor_checks", tuple(tensor_checks))
        object.__setattr__(self, "_const_checks", tuple(const_checks) if self.strict else ())

    # -- identity & dispatch --------------------------------------------------------------------
    def identity(self) -> tuple[Any, ...]:
        return self.input_spec.identity(self.strict)

    def accepts(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """True when the call belongs to this graph and every tensor axis lies within its recorded range.

        Static axes must be equal; batch and dynamic axes must lie in [min, max]. Cheap: one bind, one
        flatten, then integer comparisons against precomputed bounds. Calls made of plain positional tensors
        only (the common `module(x)`), once one such call was accepted, skip the bind and the flatten: with
        the same arity and every argument a tensor leaf, binding yields the same layout, so only the tensor
        checks can differ.
        """
        arity = self._positional_arity
        if arity is not None and not kwargs and len(args) == arity and all(type(a) is torch.Tensor for a in args):
            return self._tensor_mismatch(args, explain=False) is None
        return self._check(args, kwargs, explain=False) is None

    def mismatch(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """None when `accepts` would be True, else a short reason naming the argument and shape."""
        return self._check(args, kwargs, explain=True)

    def _check(self, args: Sequence[Any], kwargs: Mapping[str, Any], *, explain: bool) -> str | None:
        try:
            bound = self.binder.bind(args, kwargs)
        except TypeError as e:
            return f"arguments do not fit forward's signature: {e}" if explain else "signature"
        leaves, treedef = flatten_values(bound)
        if treedef != self.input_spec.structure:
            return f"argument structure {treedef!r} differs from {self.input_spec.structure!r}" if explain else "tree"
        mismatch = self._tensor_mismatch(leaves, explain=explain)
        if mismatch is not None:
            return mismatch
        for index, key in self._const_checks:
            if constant_key(leaves[index]) != key:
                return f"non-tensor argument at leaf {index} differs (strict mode)" if explain else "const"
        if (
            self._positional_arity is None
            and not kwargs
            and len(leaves) == len(args)
            and all(leaf is arg and type(arg) is torch.Tensor for leaf, arg in zip(leaves, args))
        ):
            object.__setattr__(self, "_positional_arity", len(args))
        return None

    def _tensor_mismatch(self, leaves: Sequence[Any], *, explain: bool) -> str | None:
        for index, ndim, dtype, lo, hi in self._tensor_checks:
            tensor = leaves[index]
            if tensor.dtype != dtype or tensor.dim() != ndim:
                if not explain:
                    return "tensor"
                spec = self._spec_at(index)
                return (
                    f"{spec.name}: dtype/rank {tensor.dtype}/{tensor.dim()} differs from "
                    f"{dtype}/{ndim}"
                )
            for size, low, high in zip(tensor.shape, lo, hi):
                if size < low or size > high:
                    if not explain:
                        return "shape"
                    spec = self._spec_at(index)
                    return (
                        f"{spec.name}: shape {list(tensor.shape)} is outside the tuned range "
                        f"{list(spec.min_shape)}..{list(spec.max_shape)}"
                    )
        return None

    def _spec_at(self, leaf_index: int) -> Any:
        for position, check in enumerate(self._tensor_checks):
            if check[0] == leaf_index:
                return self.input_spec.tensors[position]
        raise IndexError(leaf_index)

    # -- convenience ----------------------------------------------------------------------------
    def non_static_axes(self) -> dict[str, list[int]]:
        """`{input tensor name: [axis, ...]}` for every input axis that is batch or dynamic."""
        return self.input_spec.non_static_axes()

    def has_batch_axis(self) -> bool:
        return self.input_spec.has_batch_axis()

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return self.binder.bind(args, kwargs)

    def input_tensors(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The call's input tensors in `input_spec.tensors` order (for backends that take flat inputs)."""
        leaves, _ = flatten_values(self.binder.bind(args, kwargs))
        return [leaves[check[0]] for check in self._tensor_checks]

    # -- serialization / display ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dtypes as strings); `from_dict(json.loads(json.dumps(d)))` gives an equal spec."""
        return {
            "name": self.name,
            "strict": self.strict,
            "binder": self.binder.to_dict(),
            "input_spec": self.input_spec.to_dict(),
            "output_spec": self.output_spec.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GraphSpec:
        return cls(
            name=str(data["name"]),
            input_spec=SampleMetadata.from_dict(data["input_spec"]),
            output_spec=SampleMetadata.from_dict(data["output_spec"]),
            binder=Binder.from_dict(data["binder"]) if "binder" in data else Binder.generic(),
            strict=bool(data.get("strict", True)),
        )

    def table(self) -> str:
        """The seed's layout: `Name=0`, then `Input_spec:` and `Output_spec:` tensor tables."""
        from aitune_core.specs.tables import render_graph_spec

        return render_graph_spec(self)

    def __str__(self) -> str:
        return self.table()

    def __rich__(self) -> Any:
        from aitune_core.specs.tables import graph_spec_renderable

        return graph_spec_renderable(self)
