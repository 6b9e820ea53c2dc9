"""An unmodified-style serving loop for the background-tuning tests: one request every 20 ms (small ResNet of
examples/resnet_app.py, batch 2), until the model is tuned (plus a few requests) or a deadline passes.

    python serve_loop.py --deadline 240

Prints one JSON line `SERVE-REPORT {...}`: the slowest request, the 99th percentile of the requests served before
the model was tuned, the time from the first request to TUNED, the largest difference to eager outputs, the root's
final state and the history lines that mention reuse.
"""

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from resnet_app import build_model

parser = argparse.ArgumentParser()
parser.add_argument("--deadline", type=float, default=240.0)
parser.add_argument("--after", type=int, default=5, help="requests served after the model is tuned")
options = parser.parse_args()

model = build_model()
torch.manual_seed(1)
inputs = [torch.randn(2, 3, 32, 32) for _ in range(3)]

from aitune_jit.patched_module import PatchedModule  # noqa: E402
from aitune_jit.runtime import bypassed  # noqa: E402

reference_model = copy.deepcopy(model)
with torch.no_grad(), bypassed():  # the reference: a copy the hook leaves alone (first called while bypassed)
    references = [reference_model(x) for x in inputs]

slowest = worst_error = 0.0
while_tuning = []  # seconds each request took until the model was tuned
tuned_at = None
left_after = options.after
start = time.perf_counter()
with torch.no_grad():
    for index in range(1_000_000):
        x = inputs[index % len(inputs)]
        begin = time.perf_counter()
        output = model(x)
        took = time.perf_counter() - begin
        slowest = max(slowest, took)
        worst_error = max(worst_error, (output - references[index % len(inputs)]).abs().max().item())
        node = PatchedModule.of(model)
        state = node.state.value if node is not None else "none"
        if state == "tuned" and tuned_at is None:
            tuned_at = time.perf_counter() - start
        if tuned_at is None:
            while_tuning.append(took)
        if tuned_at is not None:
            left_after -= 1
            if left_after <= 0:
                break
        if time.perf_counter() - start > options.deadline:
            break
        time.sleep(0.02)

while_tuning.sort()
p99 = while_tuning[min(len(while_tuning) - 1, int(0.99 * len(while_tuning)))] if while_tuning else None
reused = [line for line in PatchedModule.history if "reused the decision" in line]
print("SERVE-REPORT " + json.dumps({
    "slowest_s": slowest, "p99_while_tuning_s": p99, "time_to_tuned_s": tuned_at, "worst_error": worst_error,
    "state": state, "requests": index + 1, "reused": reused,
}), flush=True)
