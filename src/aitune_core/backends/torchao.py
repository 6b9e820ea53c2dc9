"""`TorchAOBackend`: quantize a copy of the module with torchao (`quantize_`), optionally compile it with Inductor.

Needs the `torchao` extra (`pip install 'aitune[torchao]'`); torchao is imported only when the backend builds or a
checkpoint is restored, and a missing library fails the build with `BackendNotAvailableError`.

    TorchAOBackend(TorchAOBackendConfig(quantization_config=Int8WeightOnlyConfig()))
    TorchAOBackend(TorchAOBackendConfig(quantization_config=Int8DynamicActivationInt8WeightConfig(), compile=False))
    TorchAOBackend(TorchAOBackendConfig(quantization_config=Float8DynamicActivationFloat8WeightConfig()))  # CUDA >= 8.9

Build
    The module is deep-copied onto the build device and the copy is quantized in place with
    `torchao.quantization.quantize_(copy, quantization_config)`: the user's module and weights are never modified.
    A config that quantizes nothing in the module (e.g. no `nn.Linear` layers) fails the build instead of
    pretending. Float8 configs need a CUDA device of compute capability >= 8.9 (checked before quantizing). With
    `compile=True` (the default) the quantized copy is wrapped in `torch.compile(backend="inductor")`, which is
    where torchao's speed-ups come from on GPU (through an `isolated_entry`: its compiled code is its own);
    `compile=False` runs the quantized copy eagerly (faster to build, used by the CPU tests). The quantized copy
    lives on the build device.

Validation
    Quantized outputs are compared with the un-quantized module's outputs, so this backend validates with
    `quantized_tolerance` (config options `quantized_rtol` / `quantized_atol`, default 0.1 / 0.1, see
    `validation/tolerance.py`): an element passes when `|out - ref| <= atol + rtol * |ref|`. A quantized result
    outside that is rejected like any other validation failure.

Checkpoint
    The quantized module's `state_dict` (torchao tensor subclasses holding the int8 / float8 data and scales) is
    written with `torch.save` into an artifact file. Loading rebuilds the module structure from the user's module
    without copying its float weights (parameters are mapped to the meta device) and assigns the saved quantized
    tensors with `load_state_dict(assign=True)`: no re-quantization from float weights. The file is read with
    `torch.load(weights_only=True)`: torchao registers its quantized tensor classes (and the enums and granularity
    objects they hold) with `torch.serialization.add_safe_globals` when `torchao.quantization` is imported, so only
    those classes can be rebuilt and no other code runs. The quantization config is stored as JSON through
    torchao's own `config_to_dict`; it is read back with `config_from_dict` after every `_type` in it was checked to
    name a torchao config, enum or dataclass (never a function). `is_jit` is False: the original module is only
    needed as a skeleton when loading.

Deactivate
    Writes the quantized state to the cache folder (once) and drops the quantized copy; `activate()` restores it from
    that file the same way a checkpoint is restored.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.backends.isolated_entry import isolated_entry
from aitune_core.backends.optional_import import import_optional
from aitune_core.errors import BackendBuildError
from aitune_core.log import get_logger

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.validation.tolerance import Tolerance

_logger = get_logger("backend.torchao")

QUANTIZED_STATE_FILE = "quantized_state_dict.pt"
FLOAT8_MIN_CAPABILITY = (8, 9)


def import_torchao_quantization() -> Any:
    """`torchao.quantization`, or BackendNotAvailableError naming the extra."""
    return import_optional("torchao.quantization", "torchao", "torchao")


@dataclasses.dataclass(frozen=True)
class TorchAOBackendConfig(BackendConfig):
    """Configuration of the TorchAO backend.

    Args:
        quantization_config: a torchao quantization config instance (`Int8WeightOnlyConfig()`,
            `Int8DynamicActivationInt8WeightConfig()`, `Float8DynamicActivationFloat8WeightConfig()`, ...);
            None means `Int8WeightOnlyConfig()`.
        compile: compile the quantized copy with `torch.compile(backend="inductor")`.
    """

    quantization_config: Any = None
    compile: bool = True

    def __post_init__(self) -> None:
        qc = self.quantization_config
        if qc is not None and (isinstance(qc, type) or not dataclasses.is_dataclass(qc)):
            raise ValueError(
                "TorchAOBackendConfig.quantization_config must be a torchao config instance such as "
                f"Int8WeightOnlyConfig(), got {qc!r}"
            )
        if not isinstance(self.compile, bool):
            raise ValueError(f"TorchAOBackendConfig.compile must be a bool, got {self.compile!r}")

    def to_dict(self) -> dict[str, Any]:
        """The torchao config as torchao's own JSON (`config_to_dict`), so a checkpoint stores no pickled object."""
        qc = self.quantization_config
        if qc is not None:
            try:
                from torchao.core.config import config_to_dict

                qc = {QC_MARK: config_to_dict(qc)}
            except Exception:  # not a torchao config: kept as it is (a checkpoint refuses to store it)
                qc = self.quantization_config
        return {"quantization_config": qc, "compile": self.compile}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> TorchAOBackendConfig:
        state = dict(state)
        qc = state.get("quantization_config")
        if isinstance(qc, dict) and QC_MARK in qc:
            state["quantization_config"] = quantization_config_from_json(qc[QC_MARK])
        return cls(**state)


#: marks a torchao config stored as torchao JSON in `TorchAOBackendConfig.to_dict()`
QC_MARK = "__torchao_config__"


def _is_config_class(cls: type, enum_type: type) -> bool:
    """Enums, dataclasses (configs, granularities) and NamedTuples (e.g. Float8MMConfig): plain value classes."""
    named_tuple = issubclass(cls, tuple) and hasattr(cls, "_fields")
    return issubclass(cls, enum_type) or dataclasses.is_dataclass(cls) or named_tuple


def _check_torchao_json(value: Any, allowed: Any) -> None:
    """Every `_type` in torchao config JSON must name a torch dtype, or a value class (config, enum, dataclass,
    NamedTuple) of torchao's allowed modules: `config_from_dict` calls what it finds, so a function name is refused
    before that."""
    import enum

    if isinstance(value, list):
        for item in value:
            _check_torchao_json(item, allowed)
        return
    if not isinstance(value, dict):
        return
    if "_type" in value:
        type_name, data = value["_type"], value.get("_data")
        if type_name == "torch.dtype":
            if not isinstance(data, str) or not isinstance(getattr(torch, data, None), torch.dtype):
                raise ValueError(f"torchao config: {data!r} is not a torch dtype")
        else:
            found = allowed(type_name) if isinstance(type_name, str) else None
            if not (isinstance(found, type) and _is_config_class(found, enum.Enum)):
                raise ValueError(f"torchao config: {type_name!r} is not a torchao config class")
    for item in value.values():
        _check_torchao_json(item, allowed)


def quantization_config_from_json(data: Any) -> Any:
    """A torchao config from its `config_to_dict` JSON, after `_check_torchao_json`."""
    import importlib

    import_torchao_quantization()
    from torchao.core.config import ALLOWED_AO_MODULES, config_from_dict

    def allowed(type_name: str) -> Any:
        for module_path in sorted(ALLOWED_AO_MODULES):
            try:
                found = getattr(importlib.import_module(module_path), type_name, None)
            except ImportError:
                continue
            if found is not None:
                return found
        return None

    _check_torchao_json(data, allowed)
    return config_from_dict(data)


def is_float8_config(quantization_config: Any) -> bool:
    return type(quantization_config).__name__.startswith("Float8")


def check_float8_device(quantization_config: Any, device: torch.device) -> None:
    """Float8 configs need a CUDA device of compute capability >= 8.9 (Ada, Hopper or newer)."""
    if not is_float8_config(quantization_config) or device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < FLOAT8_MIN_CAPABILITY:
        raise BackendBuildError(
            f"{type(quantization_config).__name__} needs a CUDA device of compute capability >= "
            f"{FLOAT8_MIN_CAPABILITY[0]}.{FLOAT8_MIN_CAPABILITY[1]}; {torch.cuda.get_device_name(device)} has "
            f"{capability[0]}.{capability[1]}"
        )


def nothing_quantized_hint(quantization_config: Any) -> str:
    """Why a config may leave a model untouched: the likely reasons, for the build error."""
    hint = "torchao quantizes nn.Linear layers by default"
    if is_float8_config(quantization_config):
        hint += "; float8 skips those whose dimensions are not multiples of 16, which its matmul needs"
    return hint


def count_quantized_tensors(module: torch.nn.Module) -> int:
    """Parameters that are tensor subclasses (torchao's quantized weights) rather than plain tensors."""
    return sum(
        1 for p in module.parameters() if type(p) not in (torch.Tensor, torch.nn.Parameter)
    )


def skeleton_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `module` whose state-dict tensors live on the meta device (no weight memory is copied).

    Non-persistent buffers (not in the state dict) are copied for real. The result is meant to receive a state dict
    with `load_state_dict(..., assign=True)`.
    """
    memo: dict[int, Any] = {}
    for tensor in module.state_dict(keep_vars=True).values():
        if not isinstance(tensor, torch.Tensor) or id(tensor) in memo:
            continue
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, torch.nn.Parameter):
            meta = torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(module, memo)


def load_quantized(module: torch.nn.Module, path: Path, device: torch.device) -> torch.nn.Module:
    """The quantized module saved at `path`, rebuilt on `device` from `module`'s structure (no re-quantization)."""
    import_torchao_quantization()  # registers torchao's tensor subclasses as safe globals for weights_only loading
    state = torch.load(path, map_location=device, weights_only=True)
    restored = skeleton_copy(module)
    restored.load_state_dict(state, strict=True, assign=True)
    for sub in restored.modules():  # non-persistent buffers came from the user's module
        for name, buffer in sub._buffers.items():
            if buffer is not None and buffer.device != device:
                sub._buffers[name] = buffer.to(device)
    return restored


class TorchAOBackend(Backend):
    """Runs a torchao-quantized copy of the module; see the module docstring."""

    config_class = TorchAOBackendConfig
    STATE_QUANTIZED = "quantized_state"

    def __init__(self, config: TorchAOBackendConfig | None = None) -> None:
        super().__init__(config)
        self._module: torch.nn.Module | None = None  # the user's module: structure for restoring
        self._quantized: torch.nn.Module | None = None
        self._runner: Any = None
        self._artifact: Path | None = None
        self._cache_dir: Path | None = None

    @property
    def config(self) -> TorchAOBackendConfig:
        return self._config  # type: ignore[return-value]

    @property
    def is_jit(self) -> bool:
        return False

    @property
    def bakes_weights(self) -> bool:
        return True

    @property
    def quantized_module(self) -> torch.nn.Module | None:
        """The quantized copy (None while inactive)."""
        return self._quantized

    def quantization_config(self) -> Any:
        """The torchao config in use (`Int8WeightOnlyConfig()` when the backend config has none)."""
        if self.config.quantization_config is not None:
            return self.config.quantization_config
        return import_torchao_quantization().Int8WeightOnlyConfig()

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        from aitune_core.validation.tolerance import quantized_tolerance

        return quantized_tolerance(dtype, self._device)

    # ------------------------------------------------------------------------------ hooks
    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        quantization = import_torchao_quantization()
        assert self._device is not None
        qconfig = self.quantization_config()
        check_float8_device(qconfig, self._device)
        quantized = copy.deepcopy(module).to(self._device)  # the user's weights are never touched
        quantization.quantize_(quantized, qconfig)
        if count_quantized_tensors(quantized) == 0:
            raise BackendBuildError(
                f"{self.describe()}: {type(qconfig).__name__} quantized no layer of {type(module).__name__} "
                f"({nothing_quantized_hint(qconfig)})"
            )
        self._module = module
        self._cache_dir = cache_dir / self.key()
        self._set_quantized(quantized)

    def _set_quantized(self, quantized: torch.nn.Module) -> None:
        self._quantized = quantized
        if self.config.compile:  # on an entry of its own: never shares compiled code with another compile of the class
            entry = isolated_entry(quantized, f"aitune_torchao_{type(quantized).__name__}")
            self._runner = torch.compile(entry, backend="inductor")
        else:
            self._runner = quantized

    def _save_quantized(self) -> Path:
        """Write the quantized state dict once; later calls return the same file."""
        if self._artifact is not None and self._artifact.is_file():
            return self._artifact
        if self._quantized is None or self._cache_dir is None:
            raise RuntimeError(f"{self.name}: no quantized module to save")
        self._cache_dir.mkdir(parents=True, exist_ok=True)
        path = self._cache_dir / QUANTIZED_STATE_FILE
        torch.save(self._quantized.state_dict(), path)
        self._artifact = path
        return path

    def _activate(self) -> None:
        if self._quantized is not None:
            return
        if self._module is None or self._artifact is None:
            raise RuntimeError(f"{self.name}: nothing to restore the quantized module from")
        assert self._device is not None
        self._set_quantized(load_quantized(self._module, self._artifact, self._device))

    def _deactivate(self) -> None:
        self._save_quantized()
        self._quantized = None
        self._runner = None

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        return self._runner(*args, **kwargs)

    # ------------------------------------------------------------------------------ checkpoint
    def _extra_state(self) -> dict[str, Any]:
        return {self.STATE_QUANTIZED: self._save_quantized()}

    def _load_extra_state(self, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> None:
        if module is None:
            raise ValueError(f"{self.name}.from_dict needs the original module (as the structure the quantized "
                             "weights are loaded into)")
        self._module = module
        self._artifact = Path(state_dict[self.STATE_QUANTIZED])
        if not self._artifact.is_file():
            raise FileNotFoundError(f"{self.name}: quantized state {self._artifact} is missing")
