"""`python -m aitune.torch.jit [--print-hierarchy] [--print-history] script.py [args...]`

Runs `script.py` as `__main__` (like `python script.py args...`: `sys.argv`, `sys.path[0]`, `__file__` and an
uncaught exception's traceback are as there) with JIT tuning switched on. Useful where autowrapt's start-up hook is
not processed.

`python -m aitune.torch.jit cache list|clear [--dir DIR]` shows or clears the persistent JIT cache
(`cache_cli.py`); a script named `cache` is run as `./cache`.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aitune.torch.jit",
        description="Run a Python script with aitune just-in-time tuning switched on.",
        usage="python -m aitune.torch.jit [--print-hierarchy] [--print-history] script.py [args...]",
    )
    parser.add_argument("--print-hierarchy", action="store_true",
                        help="print the JIT hierarchy when the script ends (after background tuning finished)")
    parser.add_argument("--print-history", action="store_true",
                        help="print the JIT tuning history when it ends (after background tuning finished)")
    parser.add_argument("script", help="path of the script to run; every argument after it goes to the script")
    return parser


def _split(arguments: list[str]) -> tuple[list[str], list[str]]:
    """The launcher's own options and the script's path, and the script's arguments exactly as given (a `--`
    among them included, as `python script.py -- x` passes it)."""
    for index, argument in enumerate(arguments):
        if not argument.startswith("-"):
            return arguments[: index + 1], arguments[index + 1:]
    return arguments, []


def run_as_main(script: str) -> None:
    """Run `script` as `__main__`, like `python script.py`: `__file__` is its absolute path, its code inherits no
    compiler flags of this file (`from __future__ import annotations` would turn its annotations into strings),
    and its module stays `sys.modules["__main__"]` after it returns, as after `python script.py`: threads and
    `atexit` handlers still running find its classes there (pickling), and background tuning that finishes after
    the script's last line finds its globals where dynamo looks for them."""
    path = os.path.abspath(script)
    with open(path, "rb") as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins, __annotations__={},
                           __loader__=importlib.machinery.SourceFileLoader("__main__", path), __spec__=None,
                           __package__=None)
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def _script_failed(exc: BaseException) -> int:
    """Show the script's uncaught exception as `python script.py` does - from the script's first frame, without
    the launcher's - and return its exit status."""
    traceback = exc.__traceback__
    while traceback is not None and traceback.tb_frame.f_code.co_filename == __file__:
        traceback = traceback.tb_next
    if traceback is not None:
        exc.with_traceback(traceback)  # (Python prints the exception's own traceback, whatever it is handed)
    sys.excepthook(type(exc), exc, exc.__traceback__)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["cache"]:
        from aitune_jit.cache_cli import main as cache_main

        return cache_main(arguments[1:])
    own, script_arguments = _split(arguments)
    options = _parser().parse_args(own)
    script = options.script
    if not os.path.isfile(script):
        print(f"python -m aitune.torch.jit: can't open file {script!r}", file=sys.stderr)
        return 2

    from aitune_jit.patched_module import PatchedModule
    from aitune_jit.switch import enable

    sys.argv = [script, *script_arguments]
    script_dir = os.path.dirname(os.path.abspath(script))
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    enable()
    code = 0
    try:
        run_as_main(script)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except Exception as exc:
        code = _script_failed(exc)
    finally:  # (the script's `__main__`, `sys.argv` and `sys.path[0]` stay, as after `python script.py`)
        if options.print_hierarchy or options.print_history:  # show what tuning decided, not where it was
            from aitune_jit.config import jit_config
            from aitune_jit.worker import wait_until_tuned

            wait_until_tuned(timeout=jit_config.tuning_timeout_s)
        if options.print_hierarchy:
            PatchedModule.print_hierarchy()
        if options.print_history:
            PatchedModule.print_history()
    return code
