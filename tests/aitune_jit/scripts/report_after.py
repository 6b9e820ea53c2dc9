"""Runs a script as __main__, then prints the JIT hierarchy and history as one JSON line (test harness).

    python report_after.py SCRIPT [ARGS...]

The harness itself switches nothing on: whatever enabled JIT tuning (the env var, an import line in the
script) happened inside the script's run. It waits for background tuning to finish before it reports.
"""

import json
import sys

from aitune_jit.launcher import run_as_main  # imports nothing of torch or aitune's hook

script = sys.argv[1]
sys.argv = sys.argv[1:]
run_as_main(script)  # the script's module stays __main__ while background tuning finishes

from aitune_jit.patched_module import PatchedModule  # noqa: E402
from aitune_jit.worker import wait_until_tuned  # noqa: E402

wait_until_tuned(timeout=300)  # the script may end while the background worker still tunes

print("JIT-REPORT " + json.dumps({"hierarchy": PatchedModule.hierarchy_lines(), "history": PatchedModule.history}))
