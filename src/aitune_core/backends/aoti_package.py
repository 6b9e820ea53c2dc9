"""`AOTIPackageBackend`: serve one graph of a module from an AOTInductor package compiled earlier, in seconds.

Why: a new process that reuses a tuning decision still compiles the decided backend again (dynamo's trace, even
with torch's caches warm, takes seconds of the GIL that requests wait for). An AOTInductor package
(`torch._inductor.aoti_load_package`) is generated code compiled to a shared library: loading one takes a fraction
of a second and runs no dynamo at all. The JIT uses it as a warm start (`aitune_jit.packaging`) and upgrades to the
decided backend in the background. The package is made by `aitune_core.aoti_packaging.compile_package` from the
flat tensor graph of `onnx_export.FlatModule`, so it takes and returns the graph spec's flat tensors.

Weights are not in the package (`aot_inductor.package_constants_in_so=False`): the loaded model is bound to the
live module's own parameters and buffers (`load_constants(..., user_managed=True)`), so it reads their current
values and in-place edits (`load_state_dict`, optimizer steps) are seen. A parameter replaced by another tensor
is not, hence `bakes_weights`: the module watch (`module_watch.py`) blocks the backend after such a change until
`refit` binds the new tensors, which refuses when the module's structure changed (its modules' classes and
`extra_repr`, e.g. a swapped activation or a new `eps`): the package computes the old structure.

The package is a shared library: loading it runs its code. `build` loads only a file whose SHA-256 matches the
one its caller recorded when the package was made (a truncated or edited file is refused with the reason), and
the caller validates the loaded backend on its own samples before any call uses it. The folder it comes from must
be trusted as much as torch's own Inductor cache, which also holds generated code that torch loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.backends.onnx_export import FlatModule
from aitune_core.errors import BackendBuildError

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec


@dataclasses.dataclass(frozen=True)
class AOTIPackageBackendConfig(BackendConfig):
    """`package`: the `.pt2` file; `sha256`: its digest when it was made (hex)."""

    package: str = ""
    sha256: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.package, str) or not isinstance(self.sha256, str):
            raise TypeError("AOTIPackageBackendConfig: package and sha256 must be strings")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes (read in chunks: packages run to megabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def structure_of(module: torch.nn.Module) -> tuple[tuple[str, str, str], ...]:
    """(name, class, extra_repr) of every submodule: what a compiled graph depends on beyond tensors."""
    return tuple((name, type(sub).__qualname__, sub.extra_repr()) for name, sub in module.named_modules())


class AOTIPackageBackend(Backend):
    """Loads `config.package` and serves the graph it was compiled for (see the module docstring)."""

    config_class = AOTIPackageBackendConfig
    checkpointable = False  # its file is code: only the JIT's own cache folder names one (after a digest check)

    def __init__(self, config: AOTIPackageBackendConfig | None = None) -> None:
        super().__init__(config)
        self._runner: Any = None
        self._flat: FlatModule | None = None
        self._graph_spec: GraphSpec | None = None
        self._structure: tuple[tuple[str, str, str], ...] = ()

    @property
    def config(self) -> AOTIPackageBackendConfig:
        return self._config  # type: ignore[return-value]

    @property
    def bakes_weights(self) -> bool:
        """The loaded model holds the weight tensors it was bound to: a replaced tensor needs `refit`."""
        return True

    def describe(self) -> str:
        return f"{type(self).__name__}({Path(self.config.package).name})"

    # ------------------------------------------------------------------------------ hooks
    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        self._flat = FlatModule(module, graph_spec)
        self._graph_spec = graph_spec
        self._load()
        self._structure = structure_of(module)

    def _load(self) -> None:
        """Load the package (after checking its digest) and bind it to the module's tensors."""
        path = Path(self.config.package)
        if not path.is_file():
            raise BackendBuildError(f"{self.describe()}: no package at {path}")
        digest = file_sha256(path)
        if digest != self.config.sha256:
            raise BackendBuildError(f"{self.describe()}: the package's SHA-256 is {digest[:12]}..., not the "
                                    f"{self.config.sha256[:12]}... recorded when it was made (damaged or edited)")
        from torch._inductor import aoti_load_package

        device = self._device
        index = device.index if device is not None and device.type == "cuda" else None
        if device is not None and device.type == "cuda" and index is None:
            index = torch.cuda.current_device()
        self._runner = aoti_load_package(str(path), device_index=-1 if index is None else index)
        self._bind()

    def _bind(self) -> None:
        """Point the loaded model's constants at the module's current parameters and buffers."""
        assert self._flat is not None and self._runner is not None
        live = dict(self._flat.named_parameters(remove_duplicate=False))
        live.update(self._flat.named_buffers(remove_duplicate=False))
        names = list(self._runner.get_constant_fqns())
        missing = [name for name in names if name not in live]
        if missing:
            raise BackendBuildError(f"{self.describe()}: the package needs tensors the module does not have "
                                    f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
        self._runner.load_constants({name: live[name].detach() for name in names}, check_full_update=True,
                                    user_managed=True)

    def _refit(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        """Bind the module's current tensors; refused when its structure changed (the package computes the old)."""
        if structure_of(module) != self._structure:
            raise BackendBuildError(f"{self.describe()}: the module's structure changed since the package was made")
        self._bind()

    def _activate(self) -> None:
        if self._flat is None:
            raise RuntimeError(f"{self.name}: no module to bind (a package backend is built, not loaded from a dict)")
        self._load()

    def _deactivate(self) -> None:
        self._runner = None

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        graph_spec = self._graph_spec
        assert graph_spec is not None and self._runner is not None
        # the package was compiled for contiguous inputs (the export's example was): copy any other layout
        tensors = [t.contiguous() for t in graph_spec.input_tensors(args, kwargs)]
        outputs = self._runner(*tensors)
        if isinstance(outputs, torch.Tensor):
            outputs = [outputs]
        return graph_spec.output_spec.unflatten(list(outputs))
