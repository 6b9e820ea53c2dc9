"""One-question benchmark scripts, each answering one question about aitune's cost or behaviour.

    python -m benchmarks.probes.hook_overhead          # make bench-hook
    python -m benchmarks.probes.tuned_call_overhead --model micro --batches 2 --device cpu --mode default

Each takes `--out` (default: a new file in benchmarks/results/local/) and writes the environment header of
`benchmarks.common`.
"""
