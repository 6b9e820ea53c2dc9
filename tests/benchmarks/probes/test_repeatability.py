"""benchmarks/probes/repeatability.py: repeated workload processes, alternated, summarized."""

import pytest

from benchmarks.probes import repeatability as rep


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


def test_fresh_cache_gives_every_process_a_folder_of_its_own(tmp_path):
    shared = {rep.cache_folder(tmp_path, False, label) for label in ("b8-r0-aitune-jit", "b8-r1-aitune-jit")}
    assert shared == {tmp_path / "cache"}
    fresh = [rep.cache_folder(tmp_path, True, label)
             for label in ("b8-r0-aitune-jit", "b8-r1-aitune-jit", "b8-r0-compile:reduce-overhead (workload)")]
    assert len(set(fresh)) == 3 and all(p.parent == tmp_path / "caches" for p in fresh)
    assert fresh[2].name == "b8-r0-compile-reduce-overhead-workload"


def test_table_adds_profiled_gpu_and_host_time_per_process():
    jit = {"medians_ms": [1.4, 1.2], **rep.summarize_runs([1.4, 1.2]),
           "profile_per_call_ms": [{"cuda_ms": 1.05, "cpu_ms": 1.3}, None]}
    row = {"model": "m", "batch": 8, "contenders": {"aitune-jit": jit}}
    text = rep.table([row])
    assert "profiled GPU ms/call" in text.splitlines()[0]
    assert text.splitlines()[-1].endswith("| 1.050, - | 1.300, - |")
