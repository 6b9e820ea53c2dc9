"""Serving a dynamo-compiled entry without ever compiling on the caller's thread.

A compiled function recompiles inside the call whose guards fail: seconds on a request's path, and a graph no
validation saw. The guards fail whenever the program changes something the trace read and dynamo guarded: a
module's plain attribute (`unet.enable_freeu(...)`, `vae.enable_tiling()`, a `mode` flag), a global, a config
value (`model.config.output_hidden_states = True`), a dtype. Measured on this project's CPU with a small BERT behind
a wrapper: 3.4 s for the first call after a plain attribute changed, 3.1 s after a global did; one such
recompile failed outright and sent the module to eager for good.

`run_only(entry)` is dynamo's run-only mode (`torch._dynamo.run`): the entry's cached compiled code runs where
its guards hold, and the plain function runs where they fail; nothing is compiled. `served(call)` tells the two
apart by the entry's own count of plain runs (`isolated_entry.eager_runs`) and raises `CompiledCodeMissed` with
the plain answer on a miss (or with the plain run's own error, which must not run a second time), so that the
dispatcher can answer with it and the backend's owner can tune again (`GraphDispatcher`). Only a backend compiled
as one graph serves this way: after a graph break, a resumed frame's miss would run plainly without being counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aitune_core.backends.isolated_entry import eager_runs
from aitune_core.errors import CompiledCodeMissed


def run_only(entry: Callable[..., Any]) -> Callable[..., Any] | None:
    """`entry` in dynamo's run-only mode, or None where this torch has none (the compiled function serves then)."""
    run = getattr(torch._dynamo, "run", None)
    return run(entry) if run is not None else None


def served(call: Callable[[], Any]) -> Any:
    """`call()` (which runs an isolated entry in run-only mode); raises `CompiledCodeMissed` carrying its answer
    when the entry's body ran as plain Python, i.e. its compiled code's guards failed."""
    before = eager_runs()
    try:
        output = call()
    except Exception as exc:
        if eager_runs() == before:
            raise  # (the compiled code failed: the dispatcher's to judge)
        missed = CompiledCodeMissed(None, error=exc)  # raised outside this handler: no chained context
    else:
        if eager_runs() == before:
            return output
        missed = CompiledCodeMissed(output)
    raise missed
