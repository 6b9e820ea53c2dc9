"""Backends and their configurations (optional libraries are imported only when a backend builds)."""

from aitune_core.backends.backend import Backend, BackendConfig, BackendState
from aitune_core.backends.onnxruntime import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from aitune_core.backends.tensorrt import TensorRTBackend, TensorRTBackendConfig
from aitune_core.backends.torch_eager import TorchEagerBackend, TorchEagerBackendConfig
from aitune_core.backends.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig
from aitune_core.backends.torch_tensorrt import TorchTensorRTBackend, TorchTensorRTBackendConfig
from aitune_core.backends.torchao import TorchAOBackend, TorchAOBackendConfig

__all__ = [
    "Backend",
    "BackendConfig",
    "BackendState",
    "ONNXRuntimeBackend",
    "ONNXRuntimeBackendConfig",
    "TensorRTBackend",
    "TensorRTBackendConfig",
    "TorchAOBackend",
    "TorchAOBackendConfig",
    "TorchEagerBackend",
    "TorchEagerBackendConfig",
    "TorchInductorBackend",
    "TorchInductorBackendConfig",
    "TorchTensorRTBackend",
    "TorchTensorRTBackendConfig",
]
