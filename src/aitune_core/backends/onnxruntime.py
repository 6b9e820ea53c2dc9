"""`ONNXRuntimeBackend`: export the graph to ONNX (`onnx_export.py`) and run it with an onnxruntime InferenceSession.

Needs the `onnx` extra (`pip install 'aitune[onnx]'`: onnx, onnxruntime, onnxscript); onnxruntime is imported only
when the backend builds or is deployed, and a missing library fails the build with `BackendNotAvailableError`.

Execution providers
    `providers=None` picks them from the build device: `CUDAExecutionProvider` (then CPU) for a CUDA device when
    onnxruntime has it, else `CPUExecutionProvider`. An explicit `providers=("TensorrtExecutionProvider",
    "CUDAExecutionProvider", ...)` is checked against `onnxruntime.get_available_providers()` when the backend
    builds (and again when a checkpoint is deployed): a provider that is not available fails with a
    `BackendBuildError` that lists the available ones.

Inputs and outputs
    Calls are flattened with the GraphSpec (nested inputs, dict inputs, kwargs) and the outputs rebuilt into the
    structure the module returned. Tensors are handed to onnxruntime with IO binding, without copies: inputs are
    bound by `data_ptr()` (a contiguous tensor on the session's device is used as is), outputs are allocated by
    onnxruntime on that device and wrapped as torch tensors through DLPack. When the session runs on the CPU but the
    backend's device is CUDA (no CUDA provider), inputs are copied to the CPU and outputs back to the device.
    On CUDA, the current torch stream is synchronized before the run, and outputs are synchronized after it.
    bfloat16 inputs or outputs are not supported (numpy, which IO binding uses to name element types, has no
    bfloat16); such graphs fail to build.

Checkpoint
    The exported ONNX folder (`model.onnx` and its `model.onnx.data`) is an artifact; the GraphSpec travels in the
    state. Loading creates a session from the artifact: no export, no original module needed (`is_jit` is False).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.backends.onnx_export import ONNX_FILE_NAME, export_onnx, input_names, output_names
from aitune_core.backends.optional_import import import_optional
from aitune_core.errors import BackendBuildError
from aitune_core.log import get_logger
from aitune_core.specs.graph_spec import GraphSpec

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample

_logger = get_logger("backend.onnxruntime")

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"
_GPU_PROVIDERS = frozenset({CUDA_PROVIDER, TENSORRT_PROVIDER})


def import_onnxruntime() -> Any:
    return import_optional("onnxruntime", "onnxruntime", "onnx")


@dataclasses.dataclass(frozen=True)
class ONNXRuntimeBackendConfig(BackendConfig):
    """Configuration of the ONNX Runtime backend.

    Args:
        providers: execution providers in priority order; None picks them from the device (see the module docstring).
        use_dynamo: True exports with `torch.onnx.export(dynamo=True)`, False with the legacy TorchScript exporter.
        opset_version: ONNX opset; None is the exporter's default.
        intra_op_num_threads: `SessionOptions.intra_op_num_threads`; None (or 0) lets onnxruntime decide.
    """

    providers: tuple[str, ...] | None = None
    use_dynamo: bool = True
    opset_version: int | None = None
    intra_op_num_threads: int | None = None

    def __post_init__(self) -> None:
        if self.providers is not None:
            if isinstance(self.providers, str) or not all(isinstance(p, str) for p in self.providers):
                raise ValueError(f"ONNXRuntimeBackendConfig.providers must be a sequence of provider names, "
                                 f"got {self.providers!r}")
            if not self.providers:
                raise ValueError("ONNXRuntimeBackendConfig.providers must not be empty (use None for the default)")
            object.__setattr__(self, "providers", tuple(self.providers))
        if not isinstance(self.use_dynamo, bool):
            raise ValueError(f"ONNXRuntimeBackendConfig.use_dynamo must be a bool, got {self.use_dynamo!r}")
        for name in ("opset_version", "intra_op_num_threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"ONNXRuntimeBackendConfig.{name} must be an int >= 0 or None, got {value!r}")


def _check_opset(version: int | None) -> None:
    """Refuse an opset the installed `onnx` does not have before exporting: the exporter printed a page of
    traceback for one (999) before failing (eighth review, 2026-11-26)."""
    if version is None:
        return
    try:
        import onnx

        latest = int(onnx.defs.onnx_opset_version())
    except Exception:  # (no onnx to ask: the exporter decides)
        return
    if not 7 <= version <= latest:
        raise BackendBuildError(f"ONNXRuntimeBackendConfig.opset_version={version} is not an opset the installed onnx "
                                f"{onnx.__version__} has (7..{latest})")


def resolve_providers(requested: tuple[str, ...] | None, available: list[str], device: torch.device) -> list[str]:
    """The providers a session uses (see the module docstring); raises BackendBuildError for unavailable ones."""
    if requested is None:
        if device.type == "cuda" and CUDA_PROVIDER in available:
            return [CUDA_PROVIDER, CPU_PROVIDER]
        return [CPU_PROVIDER]
    missing = [p for p in requested if p not in available]
    if missing:
        raise BackendBuildError(
            f"ONNX Runtime execution provider(s) {', '.join(missing)} not available; available providers: "
            f"{', '.join(available) or 'none'}"
        )
    if any(p in _GPU_PROVIDERS for p in requested) and device.type != "cuda":
        raise BackendBuildError(f"ONNX Runtime providers {', '.join(requested)} need a CUDA device, got {device}")
    return list(requested)


_NUMPY_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def numpy_dtype(dtype: torch.dtype) -> Any:
    import numpy as np

    name = _NUMPY_DTYPES.get(dtype)
    if name is None:
        raise BackendBuildError(f"ONNX Runtime IO binding does not support tensors of {dtype}")
    return np.dtype(name)


class ONNXRuntimeBackend(Backend):
    """Runs an exported ONNX graph with ONNX Runtime; see the module docstring."""

    @property
    def exports_graph(self) -> bool:
        return True

    config_class = ONNXRuntimeBackendConfig
    STATE_MODEL = "onnx_model"
    STATE_GRAPH_SPEC = "graph_spec"

    def __init__(self, config: ONNXRuntimeBackendConfig | None = None) -> None:
        super().__init__(config)
        self._graph_spec: GraphSpec | None = None
        self._model_dir: Path | None = None
        self._session: Any = None
        self._providers: list[str] = []
        self._run_device = torch.device("cpu")
        self._bound_inputs: list[tuple[int, str, Any]] = []

    @property
    def config(self) -> ONNXRuntimeBackendConfig:
        return self._config  # type: ignore[return-value]

    @property
    def is_jit(self) -> bool:
        return False

    @property
    def bakes_weights(self) -> bool:
        return True

    @property
    def providers(self) -> list[str]:
        """The providers of the current session (empty before build / while inactive)."""
        return list(self._providers)

    # ------------------------------------------------------------------------------ hooks
    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        ort = import_onnxruntime()
        assert self._device is not None
        resolve_providers(self.config.providers, ort.get_available_providers(), self._device)  # fail before export
        for spec in (*graph_spec.input_spec.tensors, *graph_spec.output_spec.tensors):
            numpy_dtype(spec.dtype)
        self._graph_spec = graph_spec
        _check_opset(self.config.opset_version)
        model_dir = cache_dir / self.key()
        export_onnx(module, graph_spec, data, model_dir, self._device, use_dynamo=self.config.use_dynamo,
                    opset_version=self.config.opset_version)
        self._model_dir = model_dir
        self._create_session()

    def _create_session(self) -> None:
        ort = import_onnxruntime()
        assert self._device is not None and self._model_dir is not None and self._graph_spec is not None
        providers = resolve_providers(self.config.providers, ort.get_available_providers(), self._device)
        options = ort.SessionOptions()
        if self.config.intra_op_num_threads:
            options.intra_op_num_threads = self.config.intra_op_num_threads
        session = ort.InferenceSession(str(self._model_dir / ONNX_FILE_NAME), sess_options=options,
                                       providers=providers)
        names = [i.name for i in session.get_inputs()]
        unknown = [n for n in names if n not in input_names(self._graph_spec)]
        if unknown or [o.name for o in session.get_outputs()] != output_names(self._graph_spec):
            raise BackendBuildError(
                f"{self.describe()}: the ONNX model's inputs {names} / outputs "
                f"{[o.name for o in session.get_outputs()]} do not match graph {self._graph_spec.name}"
            )
        self._session = session
        self._providers = list(session.get_providers())
        gpu = self._device.type == "cuda" and self._providers[0] in _GPU_PROVIDERS
        self._run_device = self._device if gpu else torch.device("cpu")
        if self._run_device.type == "cuda" and self._run_device.index is None:
            self._run_device = torch.device("cuda", torch.cuda.current_device())
        # ONNX may drop inputs the graph does not use; bind only those the session has
        self._bound_inputs = [(i, n, numpy_dtype(spec.dtype)) for i, (n, spec) in
                              enumerate(zip(input_names(self._graph_spec), self._graph_spec.input_spec.tensors))
                              if n in names]
        _logger.debug("%s: session on %s with providers %s", self.describe(), self._run_device, self._providers)

    def _activate(self) -> None:
        self._create_session()

    def _deactivate(self) -> None:
        self._session = None
        self._providers = []

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        graph_spec = self._graph_spec
        assert graph_spec is not None and self._session is not None
        run_device = self._run_device
        tensors = [t.to(run_device).contiguous() for t in graph_spec.input_tensors(args, kwargs)]
        device_type = run_device.type
        device_id = run_device.index or 0
        binding = self._session.io_binding()
        for index, name, np_dtype in self._bound_inputs:
            tensor = tensors[index]
            binding.bind_input(name, device_type, device_id, np_dtype, tuple(tensor.shape), tensor.data_ptr())
        for name in output_names(graph_spec):
            binding.bind_output(name, device_type, device_id)
        if device_type == "cuda":
            torch.cuda.current_stream(run_device).synchronize()
        self._session.run_with_iobinding(binding)
        if device_type == "cuda":
            binding.synchronize_outputs()
        outputs = [torch.from_dlpack(value) for value in binding.get_outputs()]
        if run_device != self._device:
            outputs = [t.to(self._device) for t in outputs]
        return graph_spec.output_spec.unflatten(outputs)

    # ------------------------------------------------------------------------------ checkpoint
    def _extra_state(self) -> dict[str, Any]:
        assert self._graph_spec is not None and self._model_dir is not None
        return {self.STATE_MODEL: Path(self._model_dir), self.STATE_GRAPH_SPEC: self._graph_spec.to_dict()}

    def _load_extra_state(self, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> None:
        self._model_dir = Path(state_dict[self.STATE_MODEL])
        if not (self._model_dir / ONNX_FILE_NAME).is_file():
            raise FileNotFoundError(f"{self.name}: no {ONNX_FILE_NAME} in {self._model_dir}")
        self._graph_spec = GraphSpec.from_dict(state_dict[self.STATE_GRAPH_SPEC])
