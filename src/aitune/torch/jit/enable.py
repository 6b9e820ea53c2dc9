"""Importing this module switches JIT tuning on (every module outside excluded packages); once imported it is also
the package's `enable`, so it can be called as that function (`aitune_jit/callable_module.py`)."""

from aitune_jit.callable_module import make_callable
from aitune_jit.switch import enable as _enable

make_callable(__name__, _enable)
_enable()
