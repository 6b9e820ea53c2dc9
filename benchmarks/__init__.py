"""aitune's benchmarks, run from the repository root as modules (`python -m benchmarks....`).

- `benchmarks.suite`: the instrument. models -> timing -> contenders -> suite -> report; `cpu_suite` and
  `gpu_suite` are its two entry points, `suite.workloads.serve` the plain workload its subprocess contenders run.
- `benchmarks.probes`: one-question scripts (hook overhead, per-call cost of a tuned call, ...), built on the
  suite's models and timing.
- `benchmarks.common`: the shared command-line options, environment header and results writing.

Benchmarks import aitune as installed (`pip install -e .`), and only through its public `aitune.torch` API.
"""
