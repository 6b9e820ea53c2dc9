"""`raised_recompile_limit`: dynamo's recompile limit, raised while a backend's build compiles.

Why: dynamo keeps at most `recompile_limit` (8) compiled entries per code object and then silently runs the plain
function. A backend's warm-up compiles once per configuration, graph, specialized batch-1 size and grad mode of
one module, which can pass 8; past the limit its build would validate code that then runs eagerly.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

#: the recompile limit a build's compiles run under
RECOMPILE_LIMIT = 64


def raised_recompile_limit() -> Any:
    """A context manager: `recompile_limit` (`cache_size_limit` on older torch) at least `RECOMPILE_LIMIT`."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        current = getattr(config, name, None)
        if isinstance(current, int):
            return config.patch(**{name: max(current, RECOMPILE_LIMIT)})
    return contextlib.nullcontext()
