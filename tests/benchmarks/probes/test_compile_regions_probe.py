"""benchmarks/probes/compile_regions.py (named apart from tests/aitune_core/test_compile_regions.py): the
summary's cold, warm and steady medians and their ratios."""

from __future__ import annotations

import pytest

from benchmarks.probes import compile_regions as bench


def _row(variant: str, phase: str, compile_s: float, steady_ms: float = 2.0, **extra: object) -> dict:
    return {"model": "m", "variant": variant, "phase": phase, "compile_s": compile_s, "steady_ms": steady_ms,
            "blocks": 6 if variant == "regions" else 0, **extra}


def test_summary_separates_cold_and_warm_processes():
    rows = [_row("plain", "cold", 10.0, 2.0), _row("plain", "warm", 2.0, 2.2),
            _row("regions", "cold", 6.0, 1.0), _row("regions", "warm", 3.0, 1.1),
            _row("regions", "cold", 8.0, 3.0, error="crashed")]  # a failed process counts nowhere
    [row] = bench._summary(rows, ["m"])
    assert row["plain_compile_s"] == 10.0 and row["regions_compile_s"] == 6.0
    assert row["compile_regions_over_plain"] == pytest.approx(0.6)
    assert row["plain_warm_compile_s"] == 2.0 and row["regions_warm_compile_s"] == 3.0
    assert row["warm_compile_regions_over_plain"] == pytest.approx(1.5)
    assert row["steady_regions_over_plain"] == pytest.approx(0.5)  # the cold processes' steady state
    assert row["blocks"] == 6


def test_summary_without_warm_processes_has_no_warm_ratio():
    [row] = bench._summary([_row("plain", "cold", 10.0), _row("regions", "cold", 5.0)], ["m"])
    assert row["warm_compile_regions_over_plain"] is None and row["regions_warm_compile_s"] is None
    assert bench._summary([_row("plain", "cold", 10.0)], ["m"]) == []  # a variant missing: no row
