"""benchmarks/suite/suite.py: the time budget, file-name slugs and the argument defaults of both suites."""

from __future__ import annotations

from benchmarks.suite import cpu_suite, gpu_suite, suite


def test_budget_uses_estimates_then_the_longest_measured_time():
    budget = suite.Budget(100.0, {"compile:default": 30.0})
    assert budget.expect("compile:default") == 30.0
    assert budget.expect("unknown") == 60.0
    assert budget.fits("compile:default")
    budget.record("compile:default", 150.0)
    budget.record("compile:default", 20.0)
    assert budget.expect("compile:default") == 150.0
    assert not budget.fits("compile:default")


def test_gpu_parts_cover_the_three_models_and_default_contenders():
    args = suite.build_parser(gpu_suite.DEFAULTS, "x").parse_args(["--part", "1"])
    assert args.batches == [1, 8, 32]
    assert sorted(m for ms in gpu_suite.DEFAULTS.models.values() for m in ms) == ["bert_base", "resnet50", "vit_base"]
    assert "aitune-jit" in args.contenders and "compile:max-autotune-no-cudagraphs" in args.contenders
    assert "compile:default (workload)" in args.contenders  # the time-to-tuned comparator runs by default
    cpu_args = suite.build_parser(cpu_suite.DEFAULTS, "x").parse_args([])
    assert cpu_args.device == "cpu" and cpu_args.part == "all"
    assert list(cpu_args.contenders) == list(suite.ALL_CONTENDERS)
