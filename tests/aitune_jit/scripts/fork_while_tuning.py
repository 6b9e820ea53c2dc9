"""A program that forks while aitune's worker is inside a job that imports a module (as a first Inductor compile
imports torch's compiler). The child imports the same module and serves the model; the parent goes on serving.

    python fork_while_tuning.py WORK_DIR

Prints `CHILD-REPORT {...}` (the child's import time, its model's state, wrong answers) and `PARENT-REPORT {...}`.
The parent's job holds the graph's replica claim at the fork, so the child either reuses the parent's decision
(if the parent stored it before the child's job looked) or waits for it; the child serves until it is tuned.
Without fork safety the child waited for good on the import lock the parent's job thread held at the fork; now
the fork waits until the job has finished that import and parked at a function start (`fork_safety`).
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # jit_helpers

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import bypassed
from aitune_jit.switch import enable
from aitune_jit.worker import wait_until_tuned

#: a module whose import takes about 3 s of Python function calls (the job is inside it when the program forks)
SLOW_MODULE = '''
import time
STARTED = time.monotonic()
def _step():
    time.sleep(0.01)
while time.monotonic() - STARTED < 3.0:
    _step()
'''


def serve(model, reference, calls, wait=True):
    wrong = 0
    for index in range(calls):
        x = torch.randn(2 + index % 2, 32)
        out = model(x)
        with bypassed():
            wrong += not torch.allclose(out, reference(x), atol=1e-5)
        time.sleep(0.005)
    if wait:
        wait_until_tuned(30)
    return wrong


def main() -> None:
    work = Path(sys.argv[1])
    (work / "slow_import_for_fork.py").write_text(SLOW_MODULE)
    sys.path.insert(0, str(work))
    torch.set_grad_enabled(False)
    jit_config.cache_dir = tempfile.mkdtemp(dir=work)
    jit_config.blocking = False
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    importing = work / "importing"
    real_build = CountingBackend._build

    def build(self, *args):
        importing.touch()
        import slow_import_for_fork  # noqa: F401  (the job's first compile importing torch's compiler, in small)

        return real_build(self, *args)

    CountingBackend._build = build
    with bypassed():
        reference = make_mlp()
    enable()
    model = make_mlp()
    serve(model, reference, 2, wait=False)  # the second call queues the job
    deadline = time.monotonic() + 30
    while not importing.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # (well inside the 3 s import)
    pid = os.fork()
    if pid == 0:
        start = time.monotonic()
        import slow_import_for_fork  # noqa: F401

        imported_s = time.monotonic() - start
        wrong = serve(model, reference, 6)
        deadline = time.monotonic() + 60
        while PatchedModule.of(model).state.name != "TUNED" and time.monotonic() < deadline:
            # the parent's job claimed the graph before the fork: the child may wait for the parent's decision
            # (looked for every 2 s, on a call), or tune it itself once the parent lets go without one
            time.sleep(0.25)
            wrong += serve(model, reference, 2)
        print("CHILD-REPORT " + json.dumps({"import_s": imported_s, "state": PatchedModule.of(model).state.name,
                                            "wrong": wrong}), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    wrong = serve(model, reference, 6)
    print("PARENT-REPORT " + json.dumps({"state": PatchedModule.of(model).state.name, "wrong": wrong,
                                         "history": [h for h in PatchedModule.history if h.startswith("Tuning")]}),
          flush=True)


if __name__ == "__main__":
    main()
