"""aitune calls a module's forward from a frame that stands where torch's `Module._call_impl` calls it.

Why: a forward that warns with `stacklevel=2` (a deprecated argument, transformers' padding notices) names the
place that called it. Plainly that is torch's `module.py`, at `_call_impl`'s `return forward_call(*args, **kwargs)`;
under aitune it was aitune's recording frame (`node_recording.py`). The warning then read differently, and
Python's once-per-place record - kept in the globals of the frame the warning names - was aitune's: the same
warning showed twice in one run, once from each place (a helper's script on this CPU, 2026-11-27, a
`FutureWarning` of a deprecated argument).

`call_forward(forward, args, kwargs)` calls `forward` from a function compiled with the file name and line number
of that line of torch's, and with the globals of torch's `module.py`: a warning two levels up names the same file
and line, shows the same source line, and is recorded once where torch's is. Where that line cannot be found (a
torch without sources, another wording), it is a plain call. Not for code dynamo traces: only eager calls use it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

_logger = logging.getLogger("aitune.jit")

#: the line of `torch.nn.Module._call_impl` that calls a forward
CALL_LINE = "return forward_call(*args, **kwargs)"


def _plain_call(forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return forward(*args, **kwargs)


def _compiled_call() -> Callable[[Callable[..., Any], tuple, dict], Any]:
    """The calling function, placed at `CALL_LINE` in torch's `module.py`; the plain call where it is not found."""
    try:
        impl = torch.nn.Module._call_impl
        lines, first = inspect.getsourcelines(impl)
        filename = inspect.getsourcefile(impl)
    except (OSError, TypeError):
        return _plain_call
    number = next((first + offset for offset, line in enumerate(lines) if line.strip() == CALL_LINE), None)
    if filename is None or number is None or number < 2:
        return _plain_call
    source = "\n" * (number - 2) + "def _aitune_call_impl(forward_call, args, kwargs):\n    " + CALL_LINE + "\n"
    names: dict[str, Any] = {}
    try:  # (torch's module globals: its warning registry and `__name__`; the function is bound in `names` only)
        exec(compile(source, filename, "exec"), vars(torch.nn.modules.module), names)
    except (SyntaxError, ValueError):
        _logger.debug("could not place the forward call at %s:%s", filename, number, exc_info=True)
        return _plain_call
    return names["_aitune_call_impl"]


call_forward = _compiled_call()
