"""Stand-ins for the `tensorrt` and `torch_tensorrt` modules, for CI machines where neither can be installed.

They implement only the calls the backends make, record them, and compute nothing a real engine would: the fake
TensorRT "engine" reports output shapes from the ONNX model's symbolic dimensions and leaves outputs unwritten, the
fake `torch_tensorrt.compile` returns the exported program's module. Tests use them to check how the backends drive
the libraries (profiles, flags, bindings, serialization), never to claim TensorRT results.
"""

from __future__ import annotations

import json
import types
from typing import Any

import onnx


class _Enum:
    def __init__(self, **members: Any) -> None:
        self.__dict__.update(members)


def make_fake_tensorrt(version: str = "10.9.0") -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = []  # (what, details) in call order
    for name in ("float32", "float16", "bfloat16", "int8", "int32", "int64", "bool", "uint8", "fp8"):
        setattr(trt, name, f"DataType.{name}")
    onnx_types = {1: trt.float32, 10: trt.float16, 16: trt.bfloat16, 6: trt.int32, 7: trt.int64, 9: trt.bool}
    trt.MemoryPoolType = _Enum(WORKSPACE="WORKSPACE")
    trt.BuilderFlag = _Enum(FP16="FP16", BF16="BF16", INT8="INT8")
    trt.NetworkDefinitionCreationFlag = _Enum(EXPLICIT_BATCH=0)
    trt.TensorIOMode = _Enum(INPUT="INPUT", OUTPUT="OUTPUT")

    class Logger:
        WARNING = "WARNING"

        def __init__(self, severity: str) -> None:
            self.severity = severity

    class _Tensor:
        def __init__(self, info: onnx.ValueInfoProto) -> None:
            self.name = info.name
            self.dims = [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]
            self.dtype = onnx_types[info.type.tensor_type.elem_type]

    class Network:
        def __init__(self) -> None:
            self.inputs: list[_Tensor] = []
            self.outputs: list[_Tensor] = []

        @property
        def num_inputs(self) -> int:
            return len(self.inputs)

        def get_input(self, index: int) -> _Tensor:
            return self.inputs[index]

    class OnnxParser:
        fail_with: str | None = None

        def __init__(self, network: Network, logger: Logger) -> None:
            self.network = network
            self.errors: list[str] = []

        def parse_from_file(self, path: str) -> bool:
            trt.calls.append(("parse", path))
            if OnnxParser.fail_with:
                self.errors.append(OnnxParser.fail_with)
                return False
            model = onnx.load(path)
            self.network.inputs = [_Tensor(i) for i in model.graph.input]
            self.network.outputs = [_Tensor(o) for o in model.graph.output]
            return True

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, index: int) -> str:
            return self.errors[index]

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_shape(self, name, min_shape, opt_shape, max_shape) -> None:
            self.shapes[name] = (tuple(min_shape), tuple(opt_shape), tuple(max_shape))

    class BuilderConfig:
        def __init__(self) -> None:
            self.flags: set[str] = set()
            self.pool_limits: dict[str, int] = {}
            self.profiles: list[Profile] = []
            self.builder_optimization_level = 3

        def set_flag(self, flag: str) -> None:
            self.flags.add(flag)

        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            self.pool_limits[pool] = size

        def add_optimization_profile(self, profile: Profile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

    class Builder:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def create_network(self, flags: int) -> Network:
            trt.calls.append(("create_network", flags))
            return Network()

        def create_builder_config(self) -> BuilderConfig:
            return BuilderConfig()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: BuilderConfig) -> bytes | None:
            trt.calls.append(("build", {"flags": sorted(config.flags), "pool_limits": dict(config.pool_limits),
                                        "level": config.builder_optimization_level,
                                        "profiles": [p.shapes for p in config.profiles]}))
            engine = {
                "inputs": [(t.name, t.dims, t.dtype) for t in network.inputs],
                "outputs": [(t.name, t.dims, t.dtype) for t in network.outputs],
                "profile": {k: [list(s) for s in v] for k, v in config.profiles[0].shapes.items()},
            }
            return json.dumps(engine).encode()

    class Context:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine
            self.input_shapes: dict[str, tuple] = {}
            self.addresses: dict[str, int] = {}
            self.executed_on: list[int] = []

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            low, _opt, high = self.engine.profile[name]
            if len(shape) != len(low) or any(s < a or s > b for s, a, b in zip(shape, low, high)):
                return False
            self.input_shapes[name] = tuple(shape)
            return True

        def set_tensor_address(self, name: str, address: int) -> bool:
            self.addresses[name] = address
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            symbols = {}
            for input_name, dims, _ in self.engine.inputs:
                for dim, size in zip(dims, self.input_shapes.get(input_name, ())):
                    if isinstance(dim, str):
                        symbols[dim] = size
            dims = self.engine.dims[name]
            return tuple(symbols.get(d, -1) if isinstance(d, str) else d for d in dims)

        def execute_async_v3(self, stream_handle: int) -> bool:
            self.executed_on.append(stream_handle)
            trt.calls.append(("execute", stream_handle))
            return True

    class Engine:
        def __init__(self, data: dict) -> None:
            self.inputs = data["inputs"]
            self.outputs = data["outputs"]
            self.profile = {k: [tuple(s) for s in v] for k, v in data["profile"].items()}
            self.dims = {name: dims for name, dims, _ in self.inputs + self.outputs}
            self.dtypes = {name: dtype for name, _, dtype in self.inputs + self.outputs}
            self.contexts: list[Context] = []

        @property
        def num_io_tensors(self) -> int:
            return len(self.inputs) + len(self.outputs)

        def get_tensor_name(self, index: int) -> str:
            return [n for n, _, _ in self.inputs + self.outputs][index]

        def get_tensor_mode(self, name: str) -> str:
            return trt.TensorIOMode.INPUT if name in [n for n, _, _ in self.inputs] else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name: str) -> str:
            return self.dtypes[name]

        def create_execution_context(self) -> Context:
            context = Context(self)
            self.contexts.append(context)
            return context

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            trt.calls.append(("deserialize", len(data)))
            try:
                return Engine(json.loads(bytes(data).decode()))
            except ValueError:
                return None

    trt.Logger, trt.Builder, trt.OnnxParser, trt.Runtime = Logger, Builder, OnnxParser, Runtime
    return trt


def make_fake_torch_tensorrt() -> types.ModuleType:
    torch_trt = types.ModuleType("torch_tensorrt")
    torch_trt.calls = []

    class Input:
        def __init__(self, shape=None, min_shape=None, opt_shape=None, max_shape=None, dtype=None) -> None:
            self.shape, self.min_shape, self.opt_shape, self.max_shape, self.dtype = (
                shape, min_shape, opt_shape, max_shape, dtype)

        def __repr__(self) -> str:
            if self.shape is not None:
                return f"Input(shape={tuple(self.shape)}, dtype={self.dtype})"
            return f"Input(min={tuple(self.min_shape)}, opt={tuple(self.opt_shape)}, max={tuple(self.max_shape)}, " \
                   f"dtype={self.dtype})"

    def compile(module, ir="default", inputs=None, **options):
        torch_trt.calls.append({"module": module, "ir": ir, "inputs": inputs, "options": options})
        return module.module()  # the exported program itself: stands in for the compiled graph

    torch_trt.Input = Input
    torch_trt.compile = compile
    return torch_trt
