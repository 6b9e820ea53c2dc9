"""GraphSpec-driven ONNX export, shared by `ONNXRuntimeBackend` and `TensorRTBackend`, and the `torch.export` of the
same flat-tensor graph that `TorchTensorRTBackend` compiles (`export_program`).

Flat graphs
    ONNX graphs (and TensorRT engines) take and return flat lists of tensors. `FlatModule` adapts a module to that
    form using the GraphSpec: its inputs are the input tensors in `input_spec.tensors` order (the bound forward
    arguments, flattened with `specs/tree.py`), which it rebuilds into the original nested arguments (dicts,
    tuples, dataclasses ..., with the recorded non-tensor values) before calling the module; its outputs are the
    tensor leaves of what the module returned. Backends give callers the original output structure back with
    `graph_spec.output_spec.unflatten(tensors)`. ONNX input and output names are the spec's tensor names (`x`,
    `input_ids`, `outputs_0`, `outputs_logits`, ...).

    Non-tensor arguments are baked into the graph. That is exact in strict mode (they are part of the graph's
    identity); `check_flat_graph` refuses a graph with free scalars (`specs/free_scalars.py`) and, in non-strict
    mode, one whose samples disagree on them.

Dynamic dimensions
    Every batch and dynamic axis of the GraphSpec becomes a named dynamic dimension: batch axes keep their spec name
    (`batch0`), dynamic axes are prefixed with the tensor name (`input_ids_dim1`) because `dimN` only says which
    axis it is. The default exporter is `torch.onnx.export(dynamo=True)` (torch.export based, the default since
    torch 2.9 and the one that keeps working on torch 2.13): the names are passed as strings in `dynamic_shapes`,
    which the exporter turns into `Dim.DYNAMIC` dimensions and renames in the ONNX model. `Dim.DYNAMIC` lets
    torch.export discover relations between axes itself (two inputs sharing a sequence length become one symbol)
    instead of failing on a declared-but-wrong relation, and it fails the export (a build failure) when the model
    specializes a recorded dynamic axis to a constant, instead of silently producing a static graph. The ONNX graph
    carries no size bounds; the dispatcher only routes calls inside the recorded range to the backend.

    `use_dynamo=False` selects the legacy TorchScript exporter (deprecated by torch, kept for models torch.export
    cannot capture) with `dynamic_axes` built from the same names for inputs and outputs.

    torch.export specializes sizes 0 and 1, so the export runs on the recorded sample whose dynamic axes are all
    >= 2 if there is one (the largest such), else on the largest sample.

Files
    `export_onnx` writes `model.onnx` into a folder of its own (the dynamo exporter stores weights beside it in
    `model.onnx.data`); that folder is the checkpoint artifact.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.errors import BackendBuildError
from aitune_core.log import get_logger
from aitune_core.specs.sample_metadata import constant_key
from aitune_core.specs.tensor_spec import TensorSpec, is_batch_axis
from aitune_core.specs.tree import flatten_values

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec

_logger = get_logger("backend.onnx")

ONNX_FILE_NAME = "model.onnx"


class FlatModule(torch.nn.Module):
    """`module` seen as `(*input tensors) -> tuple(output tensors)` for one GraphSpec (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, graph_spec: GraphSpec) -> None:
        super().__init__()
        # (not `self.module = module`: torch's global module registration hooks would see aitune's wrapper)
        self._modules["module"] = module
        self.graph_spec = graph_spec
        self.training = module.training  # exporters look at (and toggle) the wrapper's mode

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bound = self.graph_spec.input_spec.unflatten(tensors)
        args, kwargs = self.graph_spec.binder.unbind(bound)
        output = self.module(*args, **kwargs)
        leaves, _ = flatten_values(output)
        return tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))


@contextmanager
def preserved_training_flags(module: torch.nn.Module) -> Iterator[None]:
    """Restore every submodule's `training` flag afterwards: exporters switch modes recursively (legacy: to eval and
    back to the wrapper's mode), which would otherwise change the user's module."""
    flags = [(sub, sub.training) for sub in module.modules()]
    try:
        yield
    finally:
        for sub, training in flags:
            sub.training = training


def input_names(graph_spec: GraphSpec) -> list[str]:
    return [t.name for t in graph_spec.input_spec.tensors]


def output_names(graph_spec: GraphSpec) -> list[str]:
    return [t.name for t in graph_spec.output_spec.tensors]


def dim_name(spec: TensorSpec, axis: int) -> str:
    """The ONNX dimension name of a non-static axis: `batch0`, or `<tensor>_dim<N>` for dynamic axes."""
    name = spec.shape[axis]
    if not isinstance(name, str):
        raise ValueError(f"axis {axis} of {spec.name} is static ({name})")
    return name if is_batch_axis(name) else f"{spec.name}_{name}"


def dynamic_dims(specs: Sequence[TensorSpec]) -> list[dict[int, str]]:
    """`[{axis: dimension name}, ...]` per tensor, for its batch and dynamic axes (empty dict when static)."""
    return [{axis: dim_name(spec, axis) for axis in spec.non_static_axes()} for spec in specs]


def check_flat_graph(graph_spec: GraphSpec, data: Sequence[Sample]) -> None:
    """Raise BackendBuildError when the graph cannot be served as a flat tensor graph (see the module docstring)."""
    if not graph_spec.output_spec.tensors:
        raise BackendBuildError(f"graph {graph_spec.name}: the module returns no tensors; nothing to export")
    if not graph_spec.input_spec.tensors:
        raise BackendBuildError(f"graph {graph_spec.name}: the module takes no tensors; nothing to export")
    if graph_spec.free_scalars():
        raise BackendBuildError(
            f"graph {graph_spec.name}: the values of {', '.join(graph_spec.free_scalars())} change between calls, and "
            "an exported graph bakes non-tensor arguments in")
    expected = graph_spec.input_spec.constant_keys()
    for index, sample in enumerate(data):
        leaves, _ = flatten_values(graph_spec.bind(sample.args, sample.kwargs))
        got = tuple(constant_key(v) for v in leaves if not isinstance(v, torch.Tensor))
        if got != expected:
            raise BackendBuildError(
                f"graph {graph_spec.name}: sample {index} passes other non-tensor arguments than the graph was "
                "recorded with; an exported graph bakes them in (record in strict mode to get one graph per value)"
            )


def export_sample(graph_spec: GraphSpec, data: Sequence[Sample]) -> Sample:
    """The sample to trace: every non-static axis >= 2 if possible (torch.export specializes 0 and 1), largest."""
    if not data:
        raise BackendBuildError(f"graph {graph_spec.name}: no samples to export with")
    specs = graph_spec.input_spec.tensors

    def key(sample: Sample) -> tuple[bool, int]:
        tensors = graph_spec.input_tensors(sample.args, sample.kwargs)
        small = any(t.shape[axis] < 2 for t, spec in zip(tensors, specs) for axis in spec.non_static_axes())
        return (not small, sum(t.numel() for t in tensors))

    return max(data, key=key)


def export_example(graph_spec: GraphSpec, data: Sequence[Sample], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The flat input tensors of `export_sample`, on `device`, contiguous."""
    sample = export_sample(graph_spec, data)
    args, kwargs = sample.inputs_to(device)
    return tuple(t.contiguous() for t in graph_spec.input_tensors(args, kwargs))


def export_program(
    module: torch.nn.Module, graph_spec: GraphSpec, data: Sequence[Sample], device: torch.device, *,
    strict: bool = False,
) -> torch.export.ExportedProgram:
    """`torch.export` of `FlatModule(module, graph_spec)`, each batch / dynamic axis `Dim.DYNAMIC(min, max)` of its
    recorded range (relations between axes are left to torch.export); used by `TorchTensorRTBackend` and
    `aitune_core.aoti_packaging` (`strict`: dynamo's trace, which changes nothing that another thread's calls of
    the module see; the non-strict trace runs the module's Python with its submodules' calls intercepted)."""
    from torch.export import Dim

    check_flat_graph(graph_spec, data)
    example = export_example(graph_spec, data, device)
    dims = tuple(
        {axis: Dim.DYNAMIC(min=spec.min_shape[axis], max=spec.max_shape[axis]) for axis in spec.non_static_axes()}
        for spec in graph_spec.input_spec.tensors
    )
    try:
        with torch.no_grad(), preserved_training_flags(module):
            return torch.export.export(FlatModule(module, graph_spec), example, dynamic_shapes=(dims,), strict=strict)
    except Exception as exc:
        raise BackendBuildError(f"torch.export of graph {graph_spec.name} failed: {type(exc).__name__}: "
                                f"{_first_lines(exc)}") from exc


def export_onnx(
    module: torch.nn.Module,
    graph_spec: GraphSpec,
    data: Sequence[Sample],
    directory: Path,
    device: torch.device,
    *,
    use_dynamo: bool = True,
    opset_version: int | None = None,
) -> Path:
    """Export `module` for `graph_spec` into `directory/model.onnx`; returns the path of the .onnx file."""
    check_flat_graph(graph_spec, data)
    example = export_example(graph_spec, data, device)
    names_in, names_out = input_names(graph_spec), output_names(graph_spec)
    dims_in = dynamic_dims(graph_spec.input_spec.tensors)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ONNX_FILE_NAME
    flat = FlatModule(module, graph_spec)
    options: dict[str, Any] = {"input_names": names_in, "output_names": names_out, "opset_version": opset_version}
    if use_dynamo:
        # one entry for the `*tensors` parameter of FlatModule.forward: a tuple with one dict per tensor
        options["dynamic_shapes"] = (tuple(dims_in),)
    else:
        dims_out = dynamic_dims(graph_spec.output_spec.tensors)
        options["dynamic_axes"] = {
            name: dims for name, dims in zip([*names_in, *names_out], [*dims_in, *dims_out]) if dims
        }
    _logger.debug("exporting graph %s to %s (dynamo=%s, dynamic dims %s)", graph_spec.name, path, use_dynamo, dims_in)
    previous = logging.getLogger("torch.onnx").level
    try:
        with torch.no_grad(), warnings.catch_warnings(), preserved_training_flags(module):
            warnings.simplefilter("ignore")  # the exporter's deprecation and "training mode" chatter
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            torch.onnx.export(flat, example, str(path), dynamo=use_dynamo, verbose=False, **options)
    except Exception as exc:
        raise BackendBuildError(f"ONNX export of graph {graph_spec.name} failed: {type(exc).__name__}: "
                                f"{_first_lines(exc)}") from exc
    finally:
        logging.getLogger("torch.onnx").setLevel(previous)
    if not path.is_file():
        raise BackendBuildError(f"ONNX export of graph {graph_spec.name} wrote no {path}")
    return path


def _first_lines(exc: BaseException, limit: int = 2000) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + " ..."
