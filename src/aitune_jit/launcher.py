"""`python -m aitune.torch.jit [--print-hierarchy] [--print-history] script.py [args...]`

Runs `script.py` as `__main__` (like `python script.py args...`: `sys.argv` and `sys.path[0]` are the script's)
with JIT tuning switched on. Useful where autowrapt's start-up hook is not processed.

`python -m aitune.torch.jit cache list|clear [--dir DIR]` shows or clears the persistent JIT cache
(`cache_cli.py`); a script named `cache` is run as `./cache`.
"""

from __future__ import annotations

import argparse
import builtins
import os
import sys
import types
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aitune.torch.jit",
        description="Run a Python script with aitune just-in-time tuning switched on.",
    )
    parser.add_argument("--print-hierarchy", action="store_true",
                        help="print the JIT hierarchy when the script ends (after background tuning finished)")
    parser.add_argument("--print-history", action="store_true",
                        help="print the JIT tuning history when it ends (after background tuning finished)")
    parser.add_argument("script", help="path of the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return parser


def run_as_main(script: str) -> None:
    """Run `script` as `__main__`, like `python script.py`: its module stays `sys.modules["__main__"]` after it
    returns (unlike `runpy.run_path`), so that background tuning that finishes after the script's last line
    still finds the script's globals where dynamo looks for them. The caller restores `__main__` if it must."""
    with open(script, "rb") as handle:
        code = compile(handle.read(), script, "exec")
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __builtins__=builtins, __loader__=None, __spec__=None, __package__=None)
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["cache"]:
        from aitune_jit.cache_cli import main as cache_main

        return cache_main(arguments[1:])
    options = _parser().parse_args(arguments)
    script = options.script
    if not os.path.isfile(script):
        print(f"python -m aitune.torch.jit: can't open file {script!r}", file=sys.stderr)
        return 2

    from aitune_jit.patched_module import PatchedModule
    from aitune_jit.switch import enable

    saved_argv, saved_path0 = list(sys.argv), (sys.path[0] if sys.path else None)
    sys.argv = [script, *options.args]
    script_dir = os.path.dirname(os.path.abspath(script))
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    enable()
    code = 0
    saved_main = sys.modules["__main__"]
    try:
        run_as_main(script)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    finally:
        if options.print_hierarchy or options.print_history:  # show what tuning decided, not where it was
            from aitune_jit.config import jit_config
            from aitune_jit.worker import wait_until_tuned

            wait_until_tuned(timeout=jit_config.tuning_timeout_s)
        if options.print_hierarchy:
            PatchedModule.print_hierarchy()
        if options.print_history:
            PatchedModule.print_history()
        sys.modules["__main__"] = saved_main
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
    return code
