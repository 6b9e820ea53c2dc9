"""Switching JIT tuning on and off for the whole process (import and env-var mode)."""

from __future__ import annotations

from aitune_core import thread_warnings
from aitune_core.log import install_stderr_warnings, quiet_progress, remove_stderr_warnings, restore_progress
from aitune_jit import compiler_prefetch, fx_trace_lock, hook, job_draws, job_module_hooks, job_rng, reparametrized


def enable() -> None:
    """Patch `torch.nn.Module.__call__` and tune every module outside torch internals and containers,
    including modules constructed before this call. aitune's WARNINGs go to stderr unless the application
    configured logging (`aitune_core.log.install_stderr_warnings`), its INFO lines nowhere unless asked for
    (`quiet_progress`). A warm JIT cache starts loading torch's compiler in the background (`compiler_prefetch`)."""
    install_stderr_warnings()
    quiet_progress()
    hook.install()
    hook.set_global_mode(True)
    # before the program's own `torch.compile` wraps anything: a wrapper reads FX's tracing flag at wrap time, and
    # one made at start-up saw the process-wide flag a job's trace raises ("using FX to symbolically trace a
    # dynamo-optimized function" from the program's compiled model; `fx_trace_lock`)
    fx_trace_lock.install()
    reparametrized.install()  # (calls under `torch.func.functional_call` run the original module)
    compiler_prefetch.start()


def disable() -> None:
    """Restore `torch.nn.Module.__call__` (identity) and give every module back as it was: forward wrappers
    and per-module state are removed, tuned modules run their original forward again; the stderr handler of
    `enable` is removed."""
    hook.uninstall()
    job_rng.uninstall()
    job_draws.uninstall()
    job_module_hooks.uninstall()
    fx_trace_lock.uninstall()
    reparametrized.uninstall()
    thread_warnings.uninstall()
    remove_stderr_warnings()
    restore_progress()


def is_enabled() -> bool:
    """True while the patch is installed (import / env-var mode, or decorator mode)."""
    return hook.is_installed()
