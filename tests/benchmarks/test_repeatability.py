"""benchmarks/repeatability.py: repeated workload processes, alternated, summarized."""

import pytest

import repeatability as rep


def test_rounds_alternate_the_order_of_the_contenders():
    order = ["aitune-jit", "compile:reduce-overhead (workload)"]
    assert rep.run_order(order, 0) == order
    assert rep.run_order(order, 1) == list(reversed(order))
    assert rep.run_order(order, 2) == order


def test_summary_is_the_median_of_medians_and_the_relative_spread():
    s = rep.summarize_runs([1.0, 1.2, 0.9])
    assert s["median_of_medians_ms"] == 1.0
    assert (s["min_ms"], s["max_ms"]) == (0.9, 1.2)
    assert s["spread"] == pytest.approx(0.3)


def test_paired_ratios_skip_failed_rounds():
    assert rep.paired_ratios([1.0, None, 2.0], [0.5, 0.7, 2.0]) == [0.5, 1.0]


def test_table_shows_failures_and_per_round_ratios():
    row = {"model": "m", "batch": 1, "contenders": {
        "aitune-jit": {"medians_ms": [1.0, None], **rep.summarize_runs([1.0])},
        "compile:reduce-overhead (workload)": {"medians_ms": [0.9, 0.8], **rep.summarize_runs([0.9, 0.8]),
                                               "jit_ratios": [0.9]},
    }}
    text = rep.table([row])
    assert "| m | 1 | aitune-jit | 1.000, failed | 1.000 | 0% |  |" in text
    assert "0.900, 0.800" in text and "| 0.90 |" in text


def test_only_workload_contenders_are_accepted():
    with pytest.raises(SystemExit):
        rep.main(["--contenders", "aitune-jit", "compile:default"])
