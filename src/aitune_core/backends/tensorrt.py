"""`TensorRTBackend`: export the graph to ONNX (`onnx_export.py`), build a TensorRT engine, run it on torch tensors.

Needs the `tensorrt` extra (`pip install 'aitune[tensorrt]'`) and a CUDA device. tensorrt is imported only when the
backend builds or a checkpoint is deployed; without it the build fails with `BackendNotAvailableError`
("tensorrt is not installed; pip install 'aitune[tensorrt]'"), which strategies treat as a normal build failure.
Written against the documented TensorRT 10 Python API; this project's CI cannot install TensorRT, so the code paths
that need the library are exercised there only with a stand-in module (see tests/aitune_core/test_tensorrt.py).

Build
    1. ONNX export shared with ONNX Runtime (named dynamic dimensions for the batch and dynamic axes).
    2. `OnnxParser` into a network, one optimization profile from the GraphSpec (`trt_profiles.py`: min and max are
       the recorded extremes, opt the most frequent recorded shapes).
    3. Precision: `precision="fp32"` (default; TF32 as TensorRT decides), `"fp16"` or `"bf16"` (the builder flag: the
       builder may pick those kernels where faster; inputs and outputs keep the ONNX types). `"int8"` needs
       calibrated quantization (e.g. NVIDIA ModelOpt Q/DQ ONNX) that this backend does not implement: it fails the
       build with a `BackendBuildError` saying so (use TorchAOBackend for int8).
    4. `workspace_size` (bytes) and `builder_optimization_level` (0-5) are passed to the builder config when set.

Runtime
    Input tensors are bound without copies (`set_input_shape` + `set_tensor_address(data_ptr)` of the contiguous
    tensor), outputs are allocated as torch tensors of the shape the context reports and bound the same way, and
    `execute_async_v3` runs on the current torch CUDA stream, so the call is ordered with the caller's other work
    and needs no synchronization. Outputs whose shape depends on the data (-1 after the inputs are set) are not
    supported and fail at validation.

Checkpoint
    The serialized engine is an artifact file (`model.engine`); the state records the GraphSpec (input/output names,
    structure to rebuild), the profile the engine was built for and the TensorRT version. Loading deserializes the
    engine: no export, no rebuild, no original module (`is_jit` is False). An engine only runs with the TensorRT
    version (and GPU family) it was built with: a mismatch fails at deploy with both versions named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.backends.onnx_export import export_onnx, input_names, output_names
from aitune_core.backends.optional_import import import_optional
from aitune_core.backends.trt_profiles import ShapeRange, profiles_from_dict, profiles_from_graph_spec, profiles_to_dict
from aitune_core.errors import BackendBuildError, CheckpointError
from aitune_core.log import get_logger
from aitune_core.specs.graph_spec import GraphSpec

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.validation.tolerance import Tolerance

_logger = get_logger("backend.tensorrt")

ENGINE_FILE_NAME = "model.engine"
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")
_REDUCED_PRECISION_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
INT8_NOT_IMPLEMENTED = (
    "TensorRT int8 needs calibrated quantization (e.g. NVIDIA ModelOpt Q/DQ ONNX), which this backend does not "
    "implement; use precision='fp16' or 'bf16', or TorchAOBackend for int8"
)


def import_tensorrt() -> Any:
    return import_optional("tensorrt", "tensorrt", "tensorrt")


def check_precision(precision: str, allowed: tuple[str, ...], owner: str) -> None:
    if precision not in allowed:
        raise ValueError(f"{owner}.precision must be one of {', '.join(map(repr, allowed))}, got {precision!r}")


def check_optional_int(value: Any, name: str, owner: str, low: int = 0, high: int | None = None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{owner}.{name} must be None or an int {bounds}, got {value!r}")


def precision_tolerance(precision: str, dtype: torch.dtype, device: torch.device | None) -> Tolerance:
    """Default tolerance for `dtype`, widened to the reduced precision's when fp16 / bf16 kernels may be used."""
    from aitune_core.validation.tolerance import default_tolerance

    base = default_tolerance(dtype, device)
    reduced = _REDUCED_PRECISION_DTYPES.get(precision)
    if reduced is not None and (dtype.is_floating_point or dtype.is_complex):
        return base.widen(default_tolerance(reduced, device))
    return base


def require_cuda(device: torch.device, owner: str) -> None:
    if device.type != "cuda":
        raise BackendBuildError(f"{owner} needs a CUDA device, got {device}")


@dataclasses.dataclass(frozen=True)
class TensorRTBackendConfig(BackendConfig):
    """Configuration of the TensorRT backend.

    Args:
        precision: "fp32", "fp16", "bf16" (builder flags) or "int8" (not implemented: fails the build).
        use_dynamo: ONNX exporter: True `torch.onnx.export(dynamo=True)`, False the legacy TorchScript exporter.
        opset_version: ONNX opset; None is the exporter's default.
        workspace_size: builder workspace memory pool limit in bytes; None is TensorRT's default.
        builder_optimization_level: 0-5 (higher builds slower and may run faster); None is TensorRT's default (3).
    """

    precision: str = "fp32"
    use_dynamo: bool = True
    opset_version: int | None = None
    workspace_size: int | None = None
    builder_optimization_level: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_precision(self.precision, PRECISIONS, owner)
        if not isinstance(self.use_dynamo, bool):
            raise ValueError(f"{owner}.use_dynamo must be a bool, got {self.use_dynamo!r}")
        check_optional_int(self.opset_version, "opset_version", owner, 1)
        check_optional_int(self.workspace_size, "workspace_size", owner, 1)
        check_optional_int(self.builder_optimization_level, "builder_optimization_level", owner, 0, 5)


# ---------------------------------------------------------------------------------------------------- engine build
def build_engine(trt: Any, onnx_path: Path, profiles: Mapping[str, ShapeRange], config: TensorRTBackendConfig) -> bytes:
    """Parse the ONNX file and build a serialized engine with one optimization profile."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if int(str(trt.__version__).split(".")[0]) < 10:  # explicit batch is the only mode (and the default) from 10 on
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendBuildError(f"TensorRT could not parse {onnx_path.name}: {errors or 'unknown error'}")
    builder_config = builder.create_builder_config()
    if config.workspace_size is not None:
        builder_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, config.workspace_size)
    if config.builder_optimization_level is not None:
        builder_config.builder_optimization_level = config.builder_optimization_level
    if config.precision == "fp16":
        builder_config.set_flag(trt.BuilderFlag.FP16)
    elif config.precision == "bf16":
        builder_config.set_flag(trt.BuilderFlag.BF16)
    profile = builder.create_optimization_profile()
    network_inputs = [network.get_input(i).name for i in range(network.num_inputs)]
    for name in network_inputs:
        if name not in profiles:
            raise BackendBuildError(f"TensorRT network input {name!r} has no shape profile ({list(profiles)})")
        shape_range = profiles[name]
        profile.set_shape(name, shape_range.min, shape_range.opt, shape_range.max)
    builder_config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, builder_config)
    if serialized is None:
        raise BackendBuildError("TensorRT failed to build the engine (see the TensorRT log above)")
    return bytes(serialized)


def torch_dtype(trt: Any, trt_dtype: Any) -> torch.dtype:
    table = {
        "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8,
        "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "uint8": torch.uint8,
        "fp8": torch.float8_e4m3fn,
    }
    for name, dtype in table.items():
        if hasattr(trt, name) and getattr(trt, name) == trt_dtype:
            return dtype
    raise TypeError(f"TensorRT tensor type {trt_dtype} has no torch equivalent")


class EngineRunner:
    """An engine and its execution context, binding torch tensors by address (see the module docstring)."""

    def __init__(self, trt: Any, engine_bytes: bytes) -> None:
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        if hasattr(self._runtime, "engine_host_code_allowed"):  # an engine (e.g. from a checkpoint) may carry host
            self._runtime.engine_host_code_allowed = False     # code: never run it (TensorRT's default, made explicit)
        self.engine = self._runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise RuntimeError(f"TensorRT {trt.__version__} could not deserialize the engine (built with another "
                               "TensorRT version or for another GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: torch_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}

    def run(
        self, inputs: Mapping[str, torch.Tensor], stream_handle: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Bind `inputs` (by name) and fresh outputs by address, enqueue on `stream_handle`; returns the outputs."""
        context = self.context
        keep_alive = []
        for name in self.inputs:
            tensor = inputs[name]
            if tensor.dtype != self.dtypes[name]:
                tensor = tensor.to(self.dtypes[name])
            tensor = tensor.contiguous()
            keep_alive.append(tensor)
            if context.set_input_shape(name, tuple(tensor.shape)) is False:
                raise RuntimeError(f"TensorRT input {name}: shape {list(tensor.shape)} is outside the engine's profile")
            context.set_tensor_address(name, tensor.data_ptr())
        outputs: dict[str, torch.Tensor] = {}
        for name in self.outputs:
            shape = tuple(int(s) for s in context.get_tensor_shape(name))
            if any(s < 0 for s in shape):
                raise RuntimeError(f"TensorRT output {name} has a data-dependent shape {list(shape)}; not supported")
            out = torch.empty(shape, dtype=self.dtypes[name], device=device)
            context.set_tensor_address(name, out.data_ptr())
            outputs[name] = out
        if not context.execute_async_v3(stream_handle):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        return outputs


class TensorRTBackend(Backend):
    """Runs a TensorRT engine built from the ONNX export of the graph; see the module docstring."""

    @property
    def exports_graph(self) -> bool:
        return True

    config_class = TensorRTBackendConfig
    STATE_ENGINE = "engine"
    STATE_GRAPH_SPEC = "graph_spec"
    STATE_PROFILES = "profiles"
    STATE_TRT_VERSION = "tensorrt_version"

    def __init__(self, config: TensorRTBackendConfig | None = None) -> None:
        super().__init__(config)
        self._graph_spec: GraphSpec | None = None
        self._engine_path: Path | None = None
        self._profiles: dict[str, ShapeRange] = {}
        self._trt_version: str | None = None
        self._runner: EngineRunner | None = None

    @property
    def config(self) -> TensorRTBackendConfig:
        return self._config  # type: ignore[return-value]

    @property
    def is_jit(self) -> bool:
        return False

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
        trt = import_tensorrt()
        if self.config.precision == "int8":
            raise BackendBuildError(f"{self.describe()}: {INT8_NOT_IMPLEMENTED}")
        assert self._device is not None
        require_cuda(self._device, self.name)
        self._graph_spec = graph_spec
        self._profiles = profiles_from_graph_spec(graph_spec, data)
        folder = cache_dir / self.key()
        onnx_path = export_onnx(module, graph_spec, data, folder / "onnx", self._device,
                                use_dynamo=self.config.use_dynamo, opset_version=self.config.opset_version)
        engine = build_engine(trt, onnx_path, self._profiles, self.config)
        self._engine_path = folder / ENGINE_FILE_NAME
        self._engine_path.write_bytes(engine)
        self._trt_version = str(trt.__version__)
        self._runner = EngineRunner(trt, engine)

    def _activate(self) -> None:
        trt = import_tensorrt()
        assert self._engine_path is not None
        if self._trt_version is not None and self._trt_version != str(trt.__version__):
            raise CheckpointError(f"{self.name}: the engine was built with TensorRT {self._trt_version}, this process "
                                  f"has {trt.__version__}; rebuild it (tune again)")
        self._runner = EngineRunner(trt, self._engine_path.read_bytes())

    def _deactivate(self) -> None:
        self._runner = None

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        graph_spec, runner, device = self._graph_spec, self._runner, self._device
        assert graph_spec is not None and runner is not None and device is not None
        tensors = graph_spec.input_tensors(args, kwargs)
        inputs = {name: t.to(device) for name, t in zip(input_names(graph_spec), tensors)}
        outputs = runner.run(inputs, torch.cuda.current_stream(device).cuda_stream, device)
        ordered = [outputs[name] for name in output_names(graph_spec)]
        ordered = [t if t.dtype == spec.dtype else t.to(spec.dtype)
                   for t, spec in zip(ordered, graph_spec.output_spec.tensors)]
        return graph_spec.output_spec.unflatten(ordered)

    # ------------------------------------------------------------------------------ checkpoint
    def _extra_state(self) -> dict[str, Any]:
        assert self._graph_spec is not None and self._engine_path is not None
        return {
            self.STATE_ENGINE: Path(self._engine_path),
            self.STATE_GRAPH_SPEC: self._graph_spec.to_dict(),
            self.STATE_PROFILES: profiles_to_dict(self._profiles),
            self.STATE_TRT_VERSION: self._trt_version,
        }

    def _load_extra_state(self, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> None:
        self._engine_path = Path(state_dict[self.STATE_ENGINE])
        if not self._engine_path.is_file():
            raise FileNotFoundError(f"{self.name}: engine file {self._engine_path} is missing")
        self._graph_spec = GraphSpec.from_dict(state_dict[self.STATE_GRAPH_SPEC])
        self._profiles = profiles_from_dict(state_dict.get(self.STATE_PROFILES) or {})
        self._trt_version = state_dict.get(self.STATE_TRT_VERSION)
