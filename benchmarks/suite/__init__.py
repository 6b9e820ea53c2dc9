"""The benchmark instrument: models -> timing -> contenders -> suite -> report (see docs/benchmarks.md).

    python -m benchmarks.suite.cpu_suite          # make bench-cpu
    python -m benchmarks.suite.gpu_suite --part 1
    python -m benchmarks.suite.report             # merge results into a table
"""
