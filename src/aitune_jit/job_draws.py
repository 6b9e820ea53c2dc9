"""The random numbers a tuning job's compiler draws come from generators of the job's own.

Why: Inductor draws random numbers while it compiles: on CUDA it times a padded against an unpadded matrix multiply
on random example matrices (`fx_passes/pad_mm.py`, for a compute-bound multiply whose sizes are not multiples of 8:
GPT-2's vocabulary of 50257 at a prompt of 32 tokens), and its autotuning times its choices on random inputs
(`select_algorithm.py`, `torch._dynamo.testing.rand_strided`). (Its pattern replacements are traced under fake
tensors, which draw nothing.) Those draws take the default generators, the program's own. A compile on the
program's thread puts their states back when it ends; a background job may not (`job_rng`: it would take back the
program's own draws), so the job's draws would move the stream of a program that seeds and samples. On an H200,
one of 114 GPT-2 `generate()` calls that seeded before sampling drew another token while the JIT tuned in the
background, its scores bit-identical to the plain run's up to that step; that these draws were the cause is what
reading Inductor shows, not what a GPU run has shown yet (`benchmarks/probes/rng_under_tuning.py` measures it).

How: in those modules of torch's, the name `torch` is bound to `TorchForJobs`, which hands out torch's own
attributes except the drawing functions (`torch.randn`, `torch.randn_like`, `torch.manual_seed`, ...): called on a
job's thread (`job_rng.skipped_here()`), these draw from a generator of the job's for the device (or seed those);
on any other thread they are torch's. Nothing else changes: torch's own `torch.randn` is untouched, so dynamo,
which recognizes torch's functions by identity when it traces a program's code, sees what it always saw.

`install()` imports none of those modules: each is patched as it is imported (wrapt's post-import hook), or at once
when it already is. Importing them at the start of every job cost requests their compile: on an H200, whose image
keeps no bytecode, the job's import of `select_algorithm` and what it pulls in (Triton's code generation, flex
attention, the pattern matcher) held the interpreter while requests due every 20 ms were served, and requests 2 to
10 of the issue-16 serving workloads took 0.5-1.6 s (77-150 ms before these imports); a job whose compile never
needs a module never imports it.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.import_patches import ImportPatches
from aitune_jit import job_rng

#: torch's modules that draw random numbers while a compile runs (the module docstring says where)
DRAWING_MODULES = ("torch._inductor.fx_passes.pad_mm",
                   "torch._inductor.select_algorithm", "torch._dynamo.testing",
                   "torch._inductor.fx_passes.node_runtime_estimation")
#: functions that take a `generator=` and draw from the default one without it
_TAKING_A_GENERATOR = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial")
#: `*_like` functions, as the in-place draw that fills a tensor of the same layout
_LIKE = {"rand_like": "uniform_", "randn_like": "normal_"}

_lock = threading.Lock()
_generators: dict[str, torch.Generator] = {}
JOB_SEED = 0


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    device = kwargs.get("device")
    if device is None:
        for value in args:
            if isinstance(value, torch.Tensor):
                return value.device
        get_default = getattr(torch, "get_default_device", None)
        return get_default() if get_default is not None else torch.device("cpu")
    return torch.device(device)


def _generator(device: torch.device) -> torch.Generator:
    """The job's generator for `device` (one per device, made on first use)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = str(device)
    with _lock:
        generator = _generators.get(key)
        if generator is None:
            generator = _generators[key] = torch.Generator(device=device)
            generator.manual_seed(JOB_SEED)
    return generator


def _drawing(name: str) -> Callable[..., Any]:
    original = getattr(torch, name)

    def draw(*args: Any, **kwargs: Any) -> Any:
        if job_rng.skipped_here() and kwargs.get("generator") is None:
            kwargs["generator"] = _generator(_device_of(args, kwargs))
        return original(*args, **kwargs)

    return draw


def _filling(name: str, method: str) -> Callable[..., Any]:
    original = getattr(torch, name)

    def draw_like(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not job_rng.skipped_here() or args:
            return original(tensor, *args, **kwargs)
        out = torch.empty_like(tensor, **{k: v for k, v in kwargs.items() if k != "generator"})
        return getattr(out, method)(generator=_generator(out.device))

    return draw_like


def _seeding(*args: Any, **kwargs: Any) -> Any:
    """`torch.manual_seed` for these modules: on a job's thread it seeds the job's generators only."""
    if not job_rng.skipped_here():
        return torch.manual_seed(*args, **kwargs)
    seed = int(args[0] if args else kwargs["seed"])
    with _lock:
        for generator in _generators.values():
            generator.manual_seed(seed)
    return torch.default_generator


class TorchForJobs(types.ModuleType):
    """`torch`, as the drawing modules see it: torch's attributes, with the drawing functions routed as the module
    docstring says."""

    def __init__(self) -> None:
        super().__init__("torch")
        overrides: dict[str, Any] = {name: _drawing(name) for name in _TAKING_A_GENERATOR if hasattr(torch, name)}
        overrides.update({name: _filling(name, method) for name, method in _LIKE.items() if hasattr(torch, name)})
        overrides["manual_seed"] = _seeding
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:  # (only names the overrides do not have)
        return getattr(torch, name)

    def __dir__(self) -> list[str]:
        return dir(torch)


_proxy: TorchForJobs | None = None


def _replacements(module: types.ModuleType) -> dict[str, Any]:
    """The proxy for `module`'s `torch`, unless its `torch` is not torch's (another tool's, or none)."""
    return {"torch": _proxy} if getattr(module, "torch", None) is torch else {}


_patches = ImportPatches(lambda: DRAWING_MODULES, _replacements)


def install() -> None:
    """Bind `torch` to `TorchForJobs` in each drawing module, now where it is imported, else when it is
    (idempotent; imports nothing: module docstring)."""
    global _proxy
    with _lock:
        if _proxy is None:
            _proxy = TorchForJobs()
    _patches.install()


def uninstall() -> None:
    """Put torch back in every drawing module (each only if nobody replaced it since: `Patch.restore`)."""
    _patches.uninstall()


def installed() -> list[str]:
    """The modules whose `torch` is the proxy now."""
    return [module for module, _attribute in _patches.patched()]
