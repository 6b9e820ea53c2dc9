"""CPU benchmark suite on tiny models: the GPU suite's contenders and table, sized for a 2-core machine.

    python -m benchmarks.suite.cpu_suite        # or: make bench-cpu

Models (built in benchmarks/suite/models.py, no downloads): tiny_resnet (residual CNN, 3x32x32), tiny_vit (patch
embedding + 2 transformer layers) and tiny_bert (transformers BertModel, 2 layers, hidden 64, sequence 32);
batch sizes 1 and 8. Contenders, method and JSON are those of benchmarks/gpu_suite.py (docs/benchmarks.md).
CPU figures say whether the pieces work end to end; speed claims come from the GPU suite.
"""

from __future__ import annotations

from benchmarks.suite import suite

DEFAULTS = suite.SuiteDefaults(
    suite="cpu",
    device="cpu",
    models={"1": ["tiny_resnet", "tiny_vit", "tiny_bert"]},
    batches=[1, 8],
    warmup=10,
    iters=50,
    settle=10,
    max_warmup_s=60.0,
    budget_s=600.0,
    workload_timeout_s=240.0,
    # One intra-op thread: on a small shared machine two OpenMP threads stall whenever one is preempted.
    threads=1,
    estimates_s={"eager": 2, "eager (workload)": 10, "aitune-jit": 40, "compile:default (workload)": 30,
                 "compile:default": 20, "compile:reduce-overhead": 20, "compile:max-autotune-no-cudagraphs": 40,
                 "aitune-aot": 40},
)

if __name__ == "__main__":
    raise SystemExit(suite.main(DEFAULTS, __doc__))
