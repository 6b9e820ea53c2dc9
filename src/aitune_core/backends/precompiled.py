"""`PrecompiledBackend`: serve one graph of a module from a function torch precompiled earlier, without dynamo.

Why: a new process that reuses a tuning decision still compiles the decided backend again: dynamo's trace and the
loading of cached code take seconds of the GIL even with torch's caches warm (ResNet-50 on an H100: 5.8 s for
`torch.compile`'s first call with warm Inductor caches). torch can save a whole compiled function - dynamo's
bytecode, its guards and Inductor's code - and load it in another process (`aot_compile`,
`torch.compiler.load_compiled_function`): no trace, no compile; on that H100, ResNet-50 loaded in 2.9 s and its
first call answered 0.3-1.4 s later. Unlike an AOTInductor package (`aoti_package.py`) nothing is built with a C++
toolchain, so it also works where such packages cannot be loaded (the H100 image this project measures on).

What is precompiled is `precompiled_entry(module, *args, **kwargs)`: a call of the tuning view as the program made
it (its own positional and keyword form), so the loaded function takes the call's arguments and returns the
module's own output structure. It is made by `aitune_core.precompiling.make_precompiled`.

Per call the function's own guards (dynamo's, saved with it: argument structure, dtypes, shapes within what was
compiled, grad mode, constants such as a `scale=2.0` argument) are checked first; a call they reject is answered
by the original forward (an `inference_mode` call among them: the function was compiled under `no_grad`).
Weights are read from the module at every call (they are graph inputs), so in-place edits and replaced
parameters are seen; a changed module structure is not (`bakes_weights`, `_refit`: the module watch sends calls
to the original forward until the structure is the one precompiled).

The guards torch cannot save are left out of the file (`aitune_core.precompiling.savable_guards`): those on the
identity of functions, builtins and classes, such as `self.act is torch.tanh`. So each call also checks the
functions and classes the module's own attributes hold (`function_attributes`): a program that set
`model.act = torch.sigmoid` got tanh's answers from the function compiled with `torch.tanh` until this check.
A call after such a change runs the original forward.

The file holds Python bytecode and a pickle that torch's loader reads: loading it runs its code. `build` loads only
a file whose SHA-256 matches the one its caller recorded when it was made, and the caller validates the loaded
backend on its own samples before any call uses it. The folder it comes from must be trusted as much as torch's
own Inductor cache, which also holds pickles and generated code that torch loads.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.aoti_package import file_sha256, structure_of
from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.errors import BackendBuildError
from aitune_core.log import get_logger

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec

_logger = get_logger("backends")
#: the file layout `aitune_core.precompiling` writes: a JSON header line, then torch's bytes
FORMAT = 1
_BUILTINS = {name: value for name, value in vars(builtins).items() if not name.startswith("_")}


def read_precompiled(data: bytes) -> list[tuple[dict[str, str], bytes]]:
    """(module aliases, torch's bytes) of each function in a precompiled file; `BackendBuildError` for another
    layout."""
    line, _newline, rest = data.partition(b"\n")
    try:
        header = json.loads(line.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise BackendBuildError(f"not a precompiled file of this aitune (no header: {exc})") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BackendBuildError(f"precompiled file header {header!r:.60} is not of format {FORMAT}")
    entries = header.get("functions")
    if not isinstance(entries, list) or not entries:
        raise BackendBuildError("the precompiled file's header lists no functions")
    functions, offset = [], 0
    for entry in entries:
        modules = entry.get("modules") if isinstance(entry, dict) else None
        size = entry.get("bytes") if isinstance(entry, dict) else None
        names_ok = isinstance(modules, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in modules.items())
        if not names_ok or not isinstance(size, int) or size <= 0 or offset + size > len(rest):
            raise BackendBuildError("the precompiled file's header describes its functions wrongly")
        functions.append((modules, rest[offset:offset + size]))
        offset += size
    if offset != len(rest):
        raise BackendBuildError("the precompiled file holds more than its header describes")
    return functions


def precompiled_entry(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """What `make_precompiled` compiles and `PrecompiledBackend` calls: the module, called as the program called it.
    (A function of this module's own, so that a loading process finds it under the same name.)"""
    return module(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class PrecompiledBackendConfig(BackendConfig):
    """`artifact`: the file `save_compiled_function` wrote; `sha256`: its digest when it was made (hex)."""

    artifact: str = ""
    sha256: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.artifact, str) or not isinstance(self.sha256, str):
            raise TypeError("PrecompiledBackendConfig: artifact and sha256 must be strings")


#: attributes aitune itself sets on a module (its forward slot, its node) and changes as it tunes
_OWN_ATTRIBUTES = frozenset({"forward"})
_OWN_PREFIX = "_aitune"


def function_attributes(module: torch.nn.Module) -> tuple[tuple[str, str, Any], ...]:
    """(submodule path, attribute, value) of each function, builtin, method or class that `module` or one of its
    submodules holds in its own `__dict__`: what dynamo guarded by identity and the file could not keep."""
    found = []
    for path, sub in module.named_modules():
        for name, value in vars(sub).items():
            if name in _OWN_ATTRIBUTES or name.startswith(_OWN_PREFIX):
                continue
            if callable(value) and not isinstance(value, (torch.nn.Module, torch.Tensor)):
                found.append((path, name, value))
    return tuple(found)


def _bound(module: torch.nn.Module, expected: tuple[tuple[str, str, Any], ...]) -> tuple[tuple[dict, str, Any], ...]:
    """Each expected attribute as (the submodule's `__dict__`, name, value), for a cheap check per call."""
    return tuple((vars(module.get_submodule(path)), name, value) for path, name, value in expected)


def guard_failure(function: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    """Why the precompiled function's guards reject this call (the first failing guard, shortened)."""
    try:
        verbose = function._artifacts.guard_manager.check_verbose(function.prepare_f_locals(module, *args, **kwargs))
        parts = list(getattr(verbose, "verbose_code_parts", []) or [])
        return (str(parts[0]).split("  #")[0].strip() if parts else "") or "a guard failed"
    except Exception as exc:  # only an explanation: never fail the caller for it
        return f"a guard failed ({type(exc).__name__})"


class PrecompiledBackend(Backend):
    """Loads `config.artifact` and serves the graph it was compiled for (see the module docstring)."""

    config_class = PrecompiledBackendConfig
    checkpointable = False  # its file is code: only the JIT's own cache folder names one (after a digest check)

    def __init__(self, config: PrecompiledBackendConfig | None = None) -> None:
        super().__init__(config)
        self._functions: list[Any] = []
        self._module: torch.nn.Module | None = None
        self._structure: tuple[tuple[str, str, str], ...] = ()
        self._expected: tuple[tuple[str, str, Any], ...] = ()  # `function_attributes` when it was built
        self._watched: tuple[tuple[dict, str, Any], ...] = ()  # the same, bound to the served module
        self.rejected_calls = 0
        self.changed_calls = 0

    @property
    def config(self) -> PrecompiledBackendConfig:
        return self._config  # type: ignore[return-value]

    @property
    def bakes_weights(self) -> bool:
        """Weights are read at each call, but the structure is the one precompiled: a replaced tensor or submodule
        sends calls to the original forward until `refit` finds the structure unchanged."""
        return True

    def describe(self) -> str:
        return f"{type(self).__name__}({Path(self.config.artifact).name})"

    # ------------------------------------------------------------------------------ hooks
    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        self._module = module
        self._load()
        self._structure = structure_of(module)
        self._expected = function_attributes(module)
        self._watched = _bound(module, self._expected)
        device = self._device
        rejected = []
        for sample in data:  # functions whose guards hold for no recorded call would only call the original forward
            args, kwargs = sample.inputs_to(device) if device is not None else (sample.args, sample.kwargs)
            if self._pick(module, tuple(args), dict(kwargs)) is None:
                rejected.append((tuple(args), dict(kwargs)))
        if data and len(rejected) == len(data):
            why = guard_failure(self._functions[0], module, *rejected[0])
            raise BackendBuildError(f"{self.describe()}: its guards reject every recorded call here ({why})")

    def _load(self) -> None:
        """Load the functions (after checking the file's digest)."""
        path = Path(self.config.artifact)
        if not path.is_file():
            raise BackendBuildError(f"{self.describe()}: no precompiled function at {path}")
        digest = file_sha256(path)
        if digest != self.config.sha256:
            raise BackendBuildError(f"{self.describe()}: the file's SHA-256 is {digest[:12]}..., not the "
                                    f"{self.config.sha256[:12]}... recorded when it was made (damaged or edited)")
        loader = getattr(torch.compiler, "load_compiled_function", None)
        if loader is None:
            raise BackendBuildError(f"{self.describe()}: torch {torch.__version__} cannot load precompiled functions")
        functions = []
        for modules, payload in read_precompiled(path.read_bytes()):
            try:  # builtins too: some torch versions save a builtin the bytecode names (`type`) as a global
                scope = {**_BUILTINS, **{alias: importlib.import_module(name) for alias, name in modules.items()}}
            except ImportError as exc:
                raise BackendBuildError(f"{self.describe()}: a module it needs is not importable here ({exc})") from exc
            function = loader(io.BytesIO(payload), f_globals=scope, external_data={"module": self._module})
            disable = getattr(function, "disable_guard_check", None)
            if disable is not None:  # `_infer` checks the guards itself, once per call
                disable()
            functions.append(function)
        self._functions = functions

    def _pick(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        """The first function whose guards accept the call (checked under `no_grad`, as compiled), else None."""
        with torch.no_grad():
            for function in self._functions:
                if function.guard_check(module, *args, **kwargs):
                    return function
        return None

    def _refit(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        """Nothing to bind (weights are read at each call); refused when the module's structure changed."""
        if structure_of(module) != self._structure:
            raise BackendBuildError(f"{self.describe()}: the module's structure changed since it was precompiled")
        if _changed(_bound(module, self._expected)) or len(function_attributes(module)) != len(self._expected):
            raise BackendBuildError(f"{self.describe()}: a function the module holds changed since it was built")
        self._module = module
        self._watched = _bound(module, self._expected)

    def _activate(self) -> None:
        if self._module is None:
            raise RuntimeError(f"{self.name}: no module to call (a precompiled backend is built, not loaded)")
        self._load()

    def _deactivate(self) -> None:
        self._functions = []

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        module = self._module
        assert module is not None and self._functions
        changed = _changed(self._watched)
        if changed is not None:
            self.changed_calls += 1
            if self.changed_calls == 1:
                _logger.debug("%s: %s changed since it was built; calls run the original forward", self.describe(),
                              changed)
            return module(*args, **kwargs)
        function = self._pick(module, args, kwargs)
        if function is not None:
            with torch.no_grad():  # dispatched calls build no autograd graph; the functions were compiled so
                return function(module, *args, **kwargs)
        self.rejected_calls += 1
        if self.rejected_calls == 1:
            _logger.debug("%s: a call its guards reject runs the original forward (%s)", self.describe(),
                          guard_failure(self._functions[0], module, args, kwargs))
        return module(*args, **kwargs)


def _changed(watched: tuple[tuple[dict, str, Any], ...]) -> str | None:
    """The first watched attribute that no longer holds its value (None when all do)."""
    for namespace, name, value in watched:
        if namespace.get(name, _MISSING) is not value:
            return f"attribute {name!r}"
    return None


_MISSING = object()
