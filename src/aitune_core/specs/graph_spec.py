"""`GraphSpec`: one computational graph of a module, i.e. one family of calls that a backend can serve.

Two calls belong to the same graph when their bound arguments have the same layout, the same tensor
ranks and dtypes, and (in strict mode) the same non-tensor values, except for int / float arguments whose value
changed between the calls of the graph (`free_scalars`: they match any value). Within a graph, tensor sizes vary
inside the recorded [min, max] range of each batch / dynamic axis. The calling thread's `torch.autocast` state and
default device are part of the identity too (`autocast_state`, `default_device`): a call under autocast is another
computation, and a forward's own tensors go to the default device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from aitune_core.specs.autocast_state import (
    NO_AUTOCAST,
    AutocastState,
    any_autocast,
    autocast_from_json,
    autocast_to_json,
    current_autocast,
    describe_autocast,
)
from aitune_core.specs.binding import Binder
from aitune_core.specs.default_device import current_default_device, default_device_from_json, function_modes
from aitune_core.specs.free_scalars import free_locators, is_free_key, loose_key
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
    - `autocast`: the `torch.autocast` state the calls were made under (`autocast_state`; `()` for none). Only
      calls made under the same state belong to the graph, and its samples are replayed under it.
    - `default_device`: the thread's default device when the calls were made (`default_device`; None: the CPU),
      with the same rules.
    """

    name: str
    input_spec: SampleMetadata
    output_spec: SampleMetadata
    binder: Binder = field(default_factory=Binder.generic)
    strict: bool = True
    autocast: AutocastState = NO_AUTOCAST
    default_device: str | None = None
    #: a recorded call was made under `torch.inference_mode()`: not part of the identity (such calls compute the
    #: same), but a compiled backend compiles that mode too (dynamo guards it: the first call in it compiled
    #: inside a request, 1.0 s for a small BERT on this project's CPU)
    inference_mode: bool = field(default=False, compare=False)
    _tensor_checks: tuple[_TensorCheck, ...] = field(init=False, repr=False, compare=False, hash=False)
    _const_checks: tuple[tuple[int, Any], ...] = field(init=False, repr=False, compare=False, hash=False)
    #: `_const_checks` without the objects compared by their layout (`accepts(..., objects=False)`)
    _value_checks: tuple[tuple[int, Any], ...] = field(init=False, repr=False, compare=False, hash=False)
    _plain_thread: bool = field(init=False, repr=False, compare=False, hash=False)  # no autocast, no default device
    # call layouts (positional arity, keyword names in order) of accepted calls made only of plain tensors,
    # mapped to where each checked input tensor sits in such a call: later calls with the same layout skip
    # binding and flattening (see `accepts`)
    _fast_layouts: dict[tuple[int, tuple[str, ...]], tuple[int | str, ...]] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )

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
        object.__setattr__(self, "_value_checks", tuple((i, k) for i, k in self._const_checks if not _by_layout(k)))
        object.__setattr__(self, "_plain_thread", not self.autocast and self.default_device is None)

    # -- identity & dispatch --------------------------------------------------------------------
    def identity(self) -> tuple[Any, ...]:
        base = self.input_spec.identity(self.strict)
        if self.autocast:
            base = (*base, ("autocast", self.autocast))
        return (*base, ("default_device", self.default_device)) if self.default_device else base

    def accepts(self, args: Sequence[Any], kwargs: Mapping[str, Any], objects: bool = True) -> bool:
        """True when the call belongs to this graph and every tensor axis lies within its recorded range.

        Static axes must be equal; batch and dynamic axes must lie in [min, max]. Cheap: one bind, one
        flatten, then integer comparisons against precomputed bounds. A call made only of plain tensors
        (`module(x)`, `model(input_ids=..., attention_mask=...)`) whose layout - positional arity and keyword
        names in order - was seen in an accepted call before skips the bind and the flatten: binding such a
        call always yields the same tree with the same tensors in the same places (every other leaf comes
        from forward's defaults), so only the tensor checks can differ. A call under another autocast state
        or default device is never accepted. `objects=False` leaves out the object arguments compared by their
        layout (`object_signature`, the costliest check: about 65 us for a 12-layer `DynamicCache` on this project's
        CPU), for a caller whose backend checks that layout itself (`GraphDispatcher`).
        """
        if any_autocast() or function_modes():  # (two calls into torch: the common thread has neither)
            if current_autocast() != self.autocast or current_default_device() != self.default_device:
                return False
        elif not self._plain_thread:
            return False
        layouts = self._fast_layouts
        if layouts:
            layout = layouts.get((len(args), tuple(kwargs)))
            if (
                layout is not None
                and all(type(a) is torch.Tensor for a in args)
                and all(type(v) is torch.Tensor for v in kwargs.values())
            ):
                tensors = [args[s] if type(s) is int else kwargs[s] for s in layout]  # type: ignore[index]
                return self._tensor_mismatch(tensors, explain=False) is None
        return self._check(args, kwargs, explain=False, objects=objects) is None

    def mismatch(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """None when `accepts` would be True, else a short reason naming the argument and shape."""
        return self._check(args, kwargs, explain=True)

    def _check(self, args: Sequence[Any], kwargs: Mapping[str, Any], *, explain: bool,
               objects: bool = True) -> str | None:
        state = current_autocast()
        if state != self.autocast:
            if not explain:
                return "autocast"
            return f"called under {describe_autocast(state)}, graph recorded under {describe_autocast(self.autocast)}"
        device = current_default_device()
        if device != self.default_device:
            if not explain:
                return "default device"
            return f"called with default device {device or 'cpu'}, graph recorded with {self.default_device or 'cpu'}"
        try:
            bound = self.binder.bind(args, kwargs)
        except TypeError as e:
            return f"arguments do not fit forward's signature: {e}" if explain else "signature"
        leaves, treedef = flatten_values(bound)
        if treedef != self.input_spec.structure:
            return f"argument structure {treedef!r} differs from {self.input_spec.structure!r}" if explain else "tree"
        tensors = [leaves[check[0]] for check in self._tensor_checks]
        mismatch = self._tensor_mismatch(tensors, explain=explain)
        if mismatch is not None:
            return mismatch
        for index, key in self._const_checks if objects else self._value_checks:
            leaf = leaves[index]
            if (loose_key(leaf) if is_free_key(key) else constant_key(leaf)) != key:
                return f"non-tensor argument at leaf {index} differs (strict mode)" if explain else "const"
        self._learn_layout(args, kwargs, tensors)
        return None

    def _learn_layout(self, args: Sequence[Any], kwargs: Mapping[str, Any], tensors: list[Any]) -> None:
        """Remember where the checked tensors of an accepted all-tensor call sit, for `accepts`' fast path."""
        key = (len(args), tuple(kwargs))
        if key in self._fast_layouts or len(args) + len(kwargs) != len(tensors):
            return
        sources: dict[int, int | str] = {}
        for position, value in enumerate(args):
            if type(value) is not torch.Tensor:
                return
            sources.setdefault(id(value), position)
        for name, value in kwargs.items():
            if type(value) is not torch.Tensor:
                return
            sources.setdefault(id(value), name)
        if len(sources) != len(tensors):
            return  # one tensor passed twice: positions would be ambiguous
        layout = tuple(sources.get(id(t)) for t in tensors)
        if None not in layout:
            self._fast_layouts[key] = layout  # type: ignore[assignment]

    def _tensor_mismatch(self, tensors: Sequence[Any], *, explain: bool) -> str | None:
        """Check the input tensors, given in `input_spec.tensors` order, against their recorded ranges."""
        for position, (tensor, (_index, ndim, dtype, lo, hi)) in enumerate(zip(tensors, self._tensor_checks)):
            if tensor.dtype != dtype or tensor.dim() != ndim:
                if not explain:
                    return "tensor"
                spec = self.input_spec.tensors[position]
                return (
                    f"{spec.name}: dtype/rank {tensor.dtype}/{tensor.dim()} differs from "
                    f"{dtype}/{ndim}"
                )
            for size, low, high in zip(tensor.shape, lo, hi):
                if size < low or size > high:
                    if not explain:
                        return "shape"
                    spec = self.input_spec.tensors[position]
                    return (
                        f"{spec.name}: shape {list(tensor.shape)} is outside the tuned range "
                        f"{list(spec.min_shape)}..{list(spec.max_shape)}"
                    )
        return None

    # -- convenience ----------------------------------------------------------------------------
    def non_static_axes(self) -> dict[str, list[int]]:
        """`{input tensor name: [axis, ...]}` for every input axis that is batch or dynamic."""
        return self.input_spec.non_static_axes()

    def has_batch_axis(self) -> bool:
        return self.input_spec.has_batch_axis()

    def free_scalars(self) -> list[str]:
        """Where the int / float arguments whose value varies between this graph's calls sit (`free_scalars`)."""
        return free_locators(self.input_spec)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return self.binder.bind(args, kwargs)

    def input_tensors(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The call's input tensors in `input_spec.tensors` order (for backends that take flat inputs)."""
        leaves, _ = flatten_values(self.binder.bind(args, kwargs))
        return [leaves[check[0]] for check in self._tensor_checks]

    # -- serialization / display ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dtypes as strings); `from_dict(json.loads(json.dumps(d)))` gives an equal spec."""
        data = {
            "name": self.name,
            "strict": self.strict,
            "binder": self.binder.to_dict(),
            "input_spec": self.input_spec.to_dict(),
            "output_spec": self.output_spec.to_dict(),
        }
        if self.autocast:  # only then: files of graphs without autocast stay as they were
            data["autocast"] = autocast_to_json(self.autocast)
        if self.default_device:
            data["default_device"] = self.default_device
        if self.inference_mode:
            data["inference_mode"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GraphSpec:
        return cls(
            name=str(data["name"]),
            input_spec=SampleMetadata.from_dict(data["input_spec"]),
            output_spec=SampleMetadata.from_dict(data["output_spec"]),
            binder=Binder.from_dict(data["binder"]) if "binder" in data else Binder.generic(),
            strict=bool(data.get("strict", True)),
            autocast=autocast_from_json(data.get("autocast")),
            default_device=default_device_from_json(data.get("default_device")),
            inference_mode=data.get("inference_mode") is True,
        )


def _by_layout(key: Any) -> bool:
    """Whether a constant's identity key compares an object by its layout (`constant_key`: `("type", path,
    signature)`), not by its value."""
    return isinstance(key, tuple) and len(key) == 3 and key[0] == "type"
