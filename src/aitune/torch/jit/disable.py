"""Importing this module switches JIT tuning off and restores `torch.nn.Module.__call__`."""

from aitune_jit.switch import disable as _disable

_disable()
