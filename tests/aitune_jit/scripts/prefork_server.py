"""A prefork server (gunicorn `--preload`): the parent builds the model under aitune, answers one warm-up request,
then forks workers that serve requests of their own, all with one JIT cache folder.

    python prefork_server.py CACHE_DIR [WORKERS]

Each worker prints one JSON line `WORKER-REPORT {...}`: its final state, how many answers differed from an
identical model run eagerly, and its history lines about tuning, waiting and reuse.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # jit_helpers

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit import replica_claims
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import bypassed
from aitune_jit.switch import enable
from aitune_jit.worker import wait_until_tuned

#: a worker serves until it is tuned and has answered this many requests, or until the deadline
CALLS, DEADLINE_S = 50, 30.0


def serve(model: torch.nn.Module, reference: torch.nn.Module, worker: int) -> None:
    wrong = calls = 0
    start = time.monotonic()
    node = PatchedModule.of(model)
    while time.monotonic() - start < DEADLINE_S and (calls < CALLS or node.state.name != "TUNED"):
        x = torch.randn(2 + calls % 2, 32)
        out = model(x)
        with bypassed():
            wrong += not torch.allclose(out, reference(x), atol=1e-5)
        calls += 1
        time.sleep(0.01)
    wait_until_tuned(10)
    lines = [h for h in PatchedModule.history if "is tuning it" in h or "reused" in h or h.startswith("Tuning")]
    print("WORKER-REPORT " + json.dumps({"worker": worker, "state": node.state.name,
                                         "wrong": wrong, "calls": calls, "history": lines}), flush=True)


def main() -> None:
    torch.set_grad_enabled(False)
    replica_claims.POLL_S = 0.1
    jit_config.cache_dir = sys.argv[1]
    jit_config.blocking = False
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    CountingBackend.build_delay_s = 0.5  # (long enough for the workers to find the first one's claim)
    with bypassed():
        reference = make_mlp()
    enable()
    model = make_mlp()
    model(torch.randn(2, 32))  # the parent's warm-up request: recorded, not enough to tune
    workers = []
    for index in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
        pid = os.fork()
        if pid == 0:
            try:
                serve(model, reference, index)
            finally:
                os._exit(0)
        workers.append(pid)
    for pid in workers:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
