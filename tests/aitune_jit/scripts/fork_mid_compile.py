"""A program that forks while aitune's worker is inside a dynamo compile (it holds dynamo's compile lock); the child
compiles a function of its own with `torch.compile`.

    python fork_mid_compile.py CACHE_DIR

Prints `CHILD-REPORT {...}` (how long the child's compile took, its answer) and `PARENT-REPORT {...}` (the parent's
model state and answers after the fork). Without fork safety the child waited for good on the lock.
"""

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # jit_helpers

import torch
from jit_helpers import make_mlp

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import bypassed
from aitune_jit.switch import enable
from aitune_jit.worker import wait_until_tuned


def _job_compiling() -> bool:
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread.name.startswith("aitune-tuning-job") and thread.ident in frames:
            stack = "".join(traceback.format_stack(frames[thread.ident]))
            if "convert_frame" in stack and "_find_and_load" not in stack:
                return True
    return False


def main() -> None:
    torch.set_grad_enabled(False)
    jit_config.cache_dir = sys.argv[1]
    jit_config.blocking = False
    jit_config.min_parameters = 0
    with bypassed():
        reference = make_mlp()
    enable()
    model = make_mlp()
    for batch in (2, 3):
        model(torch.randn(batch, 32))
    deadline = time.monotonic() + 60
    while not _job_compiling() and time.monotonic() < deadline:
        time.sleep(0.01)
    pid = os.fork()
    if pid == 0:
        start = time.monotonic()
        answer = torch.compile(lambda x: torch.sin(x) + 1)(torch.zeros(4))
        print("CHILD-REPORT " + json.dumps({"compile_s": time.monotonic() - start, "answer": answer.tolist()}),
              flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    wrong = 0
    for index in range(12):
        x = torch.randn(2 + index % 2, 32)
        out = model(x)
        with bypassed():
            wrong += not torch.allclose(out, reference(x), atol=1e-4)
        if index == 5:
            wait_until_tuned(120)
    print("PARENT-REPORT " + json.dumps({"state": PatchedModule.of(model).state.name, "wrong": wrong}), flush=True)


if __name__ == "__main__":
    main()
