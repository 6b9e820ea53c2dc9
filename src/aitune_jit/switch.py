"""Switching JIT tuning on and off for the whole process (import and env-var mode)."""

from __future__ import annotations

from aitune_jit import hook


def enable() -> None:
    """Patch `torch.nn.Module.__call__` and tune every module outside torch internals and containers,
    including modules constructed before this call."""
    hook.install()
    hook.set_global_mode(True)


def disable() -> None:
    """Restore `torch.nn.Module.__call__` (identity) and give every module back as it was: forward wrappers
    and per-module state are removed, tuned modules run their original forward again."""
    hook.uninstall()


def is_enabled() -> bool:
    """True while the patch is installed (import / env-var mode, or decorator mode)."""
    return hook.is_installed()
