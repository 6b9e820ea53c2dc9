"""A tuning job's compiler registers no process-wide module hooks: every thread's module calls would run them.

Why: Inductor counts the FLOPs of single operators while it lowers a graph (`count_flops_fx`: the convolutions of a
graph when it picks a memory layout, a node's runtime estimate in the scheduler) under `FlopCounterMode`, whose
`ModuleTracker` registers global forward pre- and post-hooks (`register_module_forward_pre_hook`) for as long as the
mode is on. On a background job's thread those hooks ran in every module call of the program's threads: each
walked the program's module tree and flattened its outputs, and a request served then on an H200 (ResNet-50,
`benchmarks/results/background_tuning-h200-resnet50-bert-mixed-backlog-38cae36.json`) took 221 ms against an eager
p99 of 8 ms, its stack in `module_tracker._fw_post_hook`. The program could see them too: its calls of a
`torch.compile`d module warn about global hooks while any is registered, and its tensors that require gradients
got gradient hooks of the tracker's.

How: in the modules of torch's that register such hooks for a tracker (`TRACKING_MODULES`), the two registering
functions are replaced by versions that, on a job's thread (`job_rng.skipped_here()`), register nothing and hand back
a handle whose `remove()` does nothing; on any other thread they are torch's. What the compiler counts is operator
FLOPs, which `FlopCounterMode` counts without the tracker (its total is under "Global"; no module runs inside the
count). Each module is patched as it is imported (wrapt's post-import hook) or at once when it already is.
"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Callable
from typing import Any

from torch.utils.hooks import RemovableHandle

from aitune_core.import_patches import ImportPatches
from aitune_jit import job_rng

#: torch's modules whose trackers register global module hooks (each imports the registering functions by name)
TRACKING_MODULES = ("torch.utils.module_tracker", "torch.distributed._tools.mod_tracker")
#: the registering functions replaced in them
REGISTERING = ("register_module_forward_pre_hook", "register_module_forward_hook")

skipped = [0]  # (registrations left out on job threads: for tests and probes)


def _on_other_threads_only(register: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(register)
    def register_unless_job(*args: Any, **kwargs: Any) -> Any:
        if not job_rng.skipped_here():
            return register(*args, **kwargs)
        skipped[0] += 1
        return RemovableHandle(collections.OrderedDict())  # (its `remove()` finds nothing to remove)

    register_unless_job.aitune_job_module_hooks = True  # type: ignore[attr-defined]
    return register_unless_job


def _replacements(module: types.ModuleType) -> dict[str, Any]:
    """The registering functions of `module` that are still torch's, each by its job-aware version."""
    found = {attribute: getattr(module, attribute, None) for attribute in REGISTERING}
    return {attribute: _on_other_threads_only(original) for attribute, original in found.items()
            if original is not None and getattr(original, "__module__", "") == "torch.nn.modules.module"}


_patches = ImportPatches(lambda: TRACKING_MODULES, _replacements)


def install() -> None:
    """Replace the registering functions in each tracking module, now where it is imported, else when it is
    (idempotent; imports nothing)."""
    _patches.install()


def uninstall() -> None:
    """Put torch's functions back (each only if nobody replaced it since: `Patch.restore`)."""
    _patches.uninstall()


def installed() -> list[str]:
    """`module.function` names patched now."""
    return [f"{module}.{attribute}" for module, attribute in _patches.patched()]
