"""A program that draws random numbers (torch's default generator and Python's `random`) between calls of a model
that aitune tunes in the background meanwhile. Prints one line `RANDOM-STREAMS {...}`: the draws' sums, how many
repeated, and the model's final state; with aitune on, the sums must equal those of a run without it.

    python random_streams.py --calls 800
"""

import argparse
import json
import random
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--calls", type=int, default=800)
options = parser.parse_args()

torch.manual_seed(0)
random.seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
x = torch.ones(4, 64)
torch_draws, python_draws = [], []
with torch.no_grad():
    for _ in range(options.calls):
        model(x)
        torch_draws.append(torch.rand(1).item())
        python_draws.append(random.random())
        time.sleep(0.01)

state = "off"
try:
    from aitune.torch.jit import wait_until_tuned
    from aitune_jit.patched_module import PatchedModule

    wait_until_tuned(timeout=120)
    nodes = [PatchedModule.of(m) for m in model.modules()]
    state = ",".join(sorted({n.state.value for n in nodes if n is not None})) or "none"
except ImportError:
    pass
print("RANDOM-STREAMS " + json.dumps({
    "torch_sum": sum(torch_draws), "python_sum": sum(python_draws),
    "torch_repeats": len(torch_draws) - len(set(torch_draws)),
    "python_repeats": len(python_draws) - len(set(python_draws)), "state": state,
}))
