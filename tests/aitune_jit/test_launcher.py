"""aitune_jit/launcher.py: `python -m aitune.torch.jit script.py args` runs the script as `python script.py args`
would - its `__file__`, annotations, arguments, uncaught exception and what still runs after its last line (found by
the seventh review, each of which made an unchanged script fail or lose output under the launcher)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = '''\
import atexit, os, pickle, sys, threading

class Request:
    pass

def handle(request: Request, count: int) -> str:
    return "ok"

here = os.path.dirname(__file__)
os.chdir("/")
print("FILE", os.path.isabs(__file__), open(os.path.join(here, "data.txt")).read())
print("ANNOTATIONS", handle.__annotations__ == {"request": Request, "count": int, "return": str})
print("ARGV", sys.argv[1:])

def late():
    print("THREAD", sys.argv[1], len(pickle.dumps(Request())) > 0, flush=True)

atexit.register(lambda: print("ATEXIT", type(pickle.loads(pickle.dumps(Request()))).__name__))
threading.Timer(0.3, late).start()
if "raise" in sys.argv:
    raise ValueError("boom")
'''


def _run(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    (tmp_path / "data.txt").write_text("beside")
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP" and not k.startswith("AITUNE_JIT_")}
    env["AITUNE_JIT_CACHE_DIR"] = str(tmp_path / "jit-cache")
    return subprocess.run([sys.executable, "-m", "aitune.torch.jit", "app.py", *arguments], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_the_script_runs_as_python_would_run_it(tmp_path):
    result = _run(tmp_path, "--", "x", "--print-history")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "FILE True beside" in lines, "an absolute __file__ survives the script's chdir"
    assert "ANNOTATIONS True" in lines, "no `from __future__ import annotations` of the launcher's own"
    assert "ARGV ['--', 'x', '--print-history']" in lines, "every argument after the script is the script's"
    assert "THREAD -- True" in lines and "ATEXIT Request" in lines, "__main__ and sys.argv stay the script's"


def test_an_uncaught_exception_is_shown_from_the_script_on_with_status_1(tmp_path):
    result = _run(tmp_path, "raise")
    assert result.returncode == 1
    line = SCRIPT.splitlines().index('    raise ValueError("boom")') + 1
    assert "ValueError: boom" in result.stderr and f'app.py", line {line}, in <module>' in result.stderr
    assert "launcher.py" not in result.stderr and "runpy" not in result.stderr, result.stderr[-3000:]
