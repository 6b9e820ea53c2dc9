"""Hooks a library registers that do nothing unless the library itself asks them to collect.

Why: a hook on a submodule keeps a module from being tuned as a whole, and sends a tuned module's calls to the
original forward while it is there (`module_watch.submodule_hooks`): a compiled graph does not call submodules,
so their hooks would not fire. transformers 5 collects `output_hidden_states` / `output_attentions` through
forward hooks that it registers on every layer the first time a call asks for them, and never removes
(`transformers.utils.output_capturing`). Each such hook first reads the collector of the running call, and
returns at once when there is none - every call that does not ask for those outputs. So one such call, before or
after tuning, left a BERT or GPT-2 untuned for the rest of the process, though its hooks change nothing for the
calls that were tuned.

Such hooks are not counted. A call that asks for the outputs passes the flag as an argument (another graph,
recorded through the original forward, where the hooks fire) or sets it in the model's config (which dynamo's
guards read: the compiled code misses and the original forward answers); a dynamo-compiled backend of a graph
whose calls collect traces the hooks with the rest, and validation compares the collected outputs with the
original module's.
"""

from __future__ import annotations

from typing import Any

#: (module, function-name suffix) of the hooks described above
_INERT = (("transformers.utils.output_capturing", "output_capturing_hook"),)


def is_inert(hook: Any) -> bool:
    """Whether `hook` (a function found in a module's hook dictionary) is one of the hooks described above."""
    module = getattr(hook, "__module__", None)
    name = getattr(hook, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return False
    return any(module == where and name.endswith(suffix) for where, suffix in _INERT)


def counted(hooks: Any) -> int:
    """How many of a hook dictionary's hooks are not inert."""
    return sum(1 for hook in hooks.values() if not is_inert(hook))
