"""Parsers for the text of `AITUNE_JIT_*` environment variables (`aitune_jit.config` reads them once).

Each turns the variable's text into an option value or raises `ConfigError` saying what it expected; the
config reports that as one WARNING and keeps the default: in env-var mode the program runs whatever is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aitune_core.errors import ConfigError

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend


def env_bool(text: str) -> bool:
    """1/true/yes/on or 0/false/no/off, any case: the spellings shells and container specs use."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected a boolean (1/0, true/false), got {text!r}")


def env_int(text: str) -> int:
    """An integer; surrounding blanks are allowed (a value quoted with spaces in a unit file)."""
    try:
        return int(text.strip())
    except ValueError as exc:
        raise ConfigError(f"expected an integer, got {text!r}") from exc


def env_optional_float(text: str) -> float | None:
    """A number, or None for empty text or "none" (the option's "no limit")."""
    if text.strip().lower() in ("", "none"):
        return None
    try:
        return float(text.strip())
    except ValueError as exc:
        raise ConfigError(f"expected a number, got {text!r}") from exc


def env_list(text: str) -> list[str]:
    """Comma-separated items; empty items are dropped, so a trailing comma does no harm."""
    return [item.strip() for item in text.split(",") if item.strip()]


def env_backends(text: str) -> list[Backend]:
    """Backend class names, each built with its default config; an unknown name raises, naming the known ones."""
    from aitune_core.backends.registry import backend_class

    backends = []
    for name in env_list(text):
        try:
            backends.append(backend_class(name)())
        except KeyError as exc:
            raise ConfigError(str(exc.args[0]) if exc.args else str(exc)) from exc
    return backends


def env_optional(text: str) -> str | None:
    """Text, or None for empty text or "none" (e.g. `AITUNE_JIT_DEVICE=none`: the parameters' device)."""
    return None if text.strip().lower() in ("", "none") else text.strip()
