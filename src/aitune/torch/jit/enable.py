"""Importing this module switches JIT tuning on (every module outside excluded packages)."""

from aitune_jit.switch import enable as _enable

_enable()
