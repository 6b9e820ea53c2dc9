"""benchmarks/probes/decode_gap.py: host time by area, and the functions' own time per request."""

from __future__ import annotations

import cProfile

from benchmarks.probes import decode_gap


def test_functions_are_grouped_by_where_their_file_lies():
    assert decode_gap._area("/x/site-packages/torch/_dynamo/eval_frame.py") == "dynamo"
    assert decode_gap._area("/work/main/src/aitune_core/specs/graph_spec.py") == "aitune"
    assert decode_gap._area("/x/site-packages/transformers/generation/utils.py") == "transformers"
    assert decode_gap._area("/x/site-packages/torch/nn/modules/module.py") == "torch other"
    assert decode_gap._area("~") == "builtins" and decode_gap._area("/tmp/script.py") == "other"


def _work() -> int:
    return sum(i * i for i in range(20000))


def test_a_profile_is_summarized_per_request():
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(4):
        _work()
    profiler.disable()
    summary = decode_gap._profile_summary(profiler, requests=4)
    assert summary["ms_per_request_by_area"]["other"] > 0  # (this test file lies outside the named areas)
    row = next(r for r in summary["top_own_time"] if r["function"].endswith(" <genexpr>") or "_work" in r["function"])
    assert row["calls_per_request"] >= 1 and row["cum_ms_per_request"] >= row["own_ms_per_request"]
    assert all(ms >= 0.02 for ms in summary["own_ms_per_request"].values())
