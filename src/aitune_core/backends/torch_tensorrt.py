"""`TorchTensorRTBackend`: `torch_tensorrt.compile(ir="dynamo")` with min/opt/max inputs from the GraphSpec.

Needs the `tensorrt` extra (`pip install 'aitune[tensorrt]'`: tensorrt and torch-tensorrt) and a CUDA device.
torch_tensorrt is imported only when the backend builds or is activated; without it the build fails with
`BackendNotAvailableError` ("torch_tensorrt is not installed; pip install 'aitune[tensorrt]'"), which strategies treat
as a normal build failure. Written against the documented torch_tensorrt 2.x API; this project's CI cannot install
it, so the parts that need the library are exercised there only with a stand-in module
(tests/aitune_core/test_torch_tensorrt.py).

Build
    The module is exported with `torch.export` as a flat-tensor graph (`onnx_export.export_program`: nested and
    keyword inputs flattened with the GraphSpec, every batch / dynamic axis `Dim.DYNAMIC` over its recorded range) and
    the ExportedProgram is compiled with `torch_tensorrt.compile(program, ir="dynamo", inputs=[...])`, one
    `torch_tensorrt.Input(min_shape, opt_shape, max_shape, dtype)` per input tensor from `trt_profiles.py` (min/max:
    recorded extremes, opt: most frequent recorded shapes). Exporting first (rather than letting torch_tensorrt trace
    the module) keeps the relations torch.export finds between axes (two inputs sharing a batch size) and works for
    any forward signature. `precision` "fp16" / "bf16" adds that dtype to `enabled_precisions`; `min_block_size`,
    `workspace_size` and `optimization_level` are passed through when set.

Inference
    Flattens the call with the GraphSpec, runs the compiled module and rebuilds the original output structure.

Checkpoint
    Like the Inductor backend, only the configuration and the GraphSpec are stored and the engine is compiled again
    from the original module when the checkpoint is deployed (`is_jit` is True: the module must stay available).
    Serialized TensorRT engines are what `TensorRTBackend` checkpoints; here the rebuild keeps loading independent of
    torch_tensorrt's save formats, which have changed between releases.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.backends.onnx_export import export_program
from aitune_core.backends.optional_import import import_optional
from aitune_core.backends.tensorrt import (
    check_optional_int,
    check_precision,
    precision_tolerance,
    require_cuda,
)
from aitune_core.backends.trt_profiles import (
    ShapeRange,
    profiles_from_dict,
    profiles_from_graph_spec,
    profiles_to_dict,
)
from aitune_core.log import get_logger
from aitune_core.specs.graph_spec import GraphSpec

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.validation.tolerance import Tolerance

_logger = get_logger("backend.torch_tensorrt")

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
_PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def import_torch_tensorrt() -> Any:
    return import_optional("torch_tensorrt", "torch_tensorrt", "tensorrt")


@dataclasses.dataclass(frozen=True)
class TorchTensorRTBackendConfig(BackendConfig):
    """Configuration of the Torch-TensorRT backend.

    Args:
        precision: "fp32", "fp16" or "bf16" (added to `enabled_precisions` besides fp32).
        min_block_size: smallest run of convertible ops placed in a TensorRT engine; None is torch_tensorrt's
            default.
        workspace_size: builder workspace in bytes; None is the default.
        optimization_level: TensorRT builder optimization level 0-5; None is the default.
    """

    precision: str = "fp32"
    min_block_size: int | None = None
    workspace_size: int | None = None
    optimization_level: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_precision(self.precision, PRECISIONS, owner)
        check_optional_int(self.min_block_size, "min_block_size", owner, 1)
        check_optional_int(self.workspace_size, "workspace_size", owner, 1)
        check_optional_int(self.optimization_level, "optimization_level", owner, 0, 5)

    def compile_options(self) -> dict[str, Any]:
        """Keyword arguments for `torch_tensorrt.compile` beyond module and inputs."""
        options: dict[str, Any] = {"enabled_precisions": {torch.float32, _PRECISION_DTYPES[self.precision]}}
        for name in ("min_block_size", "workspace_size", "optimization_level"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        return options


def trt_inputs(torch_trt: Any, graph_spec: GraphSpec, profiles: dict[str, ShapeRange]) -> list[Any]:
    """One `torch_tensorrt.Input` per input tensor: a fixed shape when static, else min/opt/max."""
    inputs = []
    for spec in graph_spec.input_spec.tensors:
        shape_range = profiles[spec.name]
        if shape_range.is_static:
            inputs.append(torch_trt.Input(shape=shape_range.min, dtype=spec.dtype))
        else:
            inputs.append(torch_trt.Input(min_shape=shape_range.min, opt_shape=shape_range.opt,
                                          max_shape=shape_range.max, dtype=spec.dtype))
    return inputs


class TorchTensorRTBackend(Backend):
    """Compiles the graph with Torch-TensorRT; see the module docstring."""

    @property
    def exports_graph(self) -> bool:
        return True

    config_class = TorchTensorRTBackendConfig
    STATE_GRAPH_SPEC = "graph_spec"
    STATE_PROFILES = "profiles"

    def __init__(self, config: TorchTensorRTBackendConfig | None = None) -> None:
        super().__init__(config)
        self._module: torch.nn.Module | None = None
        self._graph_spec: GraphSpec | None = None
        self._profiles: dict[str, ShapeRange] = {}
        self._compiled: Any = None

    @property
    def config(self) -> TorchTensorRTBackendConfig:
        return self._config  # type: ignore[return-value]

    @property
    def bakes_weights(self) -> bool:
        return True

    @property
    def profiles(self) -> dict[str, ShapeRange]:
        return dict(self._profiles)

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        return precision_tolerance(self.config.precision, dtype, self._device)

    # ------------------------------------------------------------------------------ hooks
    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        torch_trt = import_torch_tensorrt()
        assert self._device is not None
        require_cuda(self._device, self.name)
        self._module = module
        self._graph_spec = graph_spec
        self._profiles = profiles_from_graph_spec(graph_spec, data)
        self._compiled = self._compile(torch_trt, data)

    def _compile(self, torch_trt: Any, data: list[Sample]) -> Any:
        assert self._module is not None and self._graph_spec is not None and self._device is not None
        program = export_program(self._module, self._graph_spec, data, self._device)
        inputs = trt_inputs(torch_trt, self._graph_spec, self._profiles)
        return torch_trt.compile(program, ir="dynamo", inputs=inputs, device=self._device,
                                 **self.config.compile_options())

    def _activate(self) -> None:
        if self._compiled is not None:
            return
        torch_trt = import_torch_tensorrt()
        if self._module is None or self._graph_spec is None:
            raise RuntimeError(f"{self.name}: nothing to compile (from_dict needs the original module)")
        self._compiled = self._compile(torch_trt, [self._synthetic_sample()])

    def _synthetic_sample(self) -> Sample:
        """A call at the `opt` shapes (random values) to export with after a checkpoint load (no samples then)."""
        from aitune_core.recording.sample import Sample

        assert self._graph_spec is not None and self._device is not None
        tensors = []
        for spec in self._graph_spec.input_spec.tensors:
            shape = self._profiles[spec.name].opt if spec.name in self._profiles else spec.max_shape
            if spec.dtype.is_floating_point:
                tensors.append(torch.randn(shape, device=self._device).to(spec.dtype))
            else:
                tensors.append(torch.zeros(shape, dtype=spec.dtype, device=self._device))
        args, kwargs = self._graph_spec.binder.unbind(self._graph_spec.input_spec.unflatten(tensors))
        return Sample(args=tuple(args), kwargs=dict(kwargs))

    def _deactivate(self) -> None:
        self._compiled = None

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        graph_spec = self._graph_spec
        assert graph_spec is not None and self._compiled is not None
        outputs = self._compiled(*graph_spec.input_tensors(args, kwargs))
        if isinstance(outputs, torch.Tensor):
            outputs = [outputs]
        return graph_spec.output_spec.unflatten(list(outputs))

    # ------------------------------------------------------------------------------ checkpoint
    def _extra_state(self) -> dict[str, Any]:
        assert self._graph_spec is not None
        return {
            self.STATE_GRAPH_SPEC: self._graph_spec.to_dict(),
            self.STATE_PROFILES: profiles_to_dict(self._profiles),
        }

    def _load_extra_state(self, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> None:
        if module is None:
            raise ValueError(f"{self.name}.from_dict needs the original module (the engine is compiled again)")
        self._module = module
        self._graph_spec = GraphSpec.from_dict(state_dict[self.STATE_GRAPH_SPEC])
        self._profiles = profiles_from_dict(state_dict.get(self.STATE_PROFILES) or {})
