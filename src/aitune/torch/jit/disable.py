"""Importing this module switches JIT tuning off and restores `torch.nn.Module.__call__`; once imported it is also
the package's `disable`, so it can be called as that function (`aitune_jit/callable_module.py`)."""

from aitune_jit.callable_module import make_callable
from aitune_jit.switch import disable as _disable

make_callable(__name__, _disable)
_disable()
