"""benchmarks/suite/call_profiles.py: op and Python-function tables of repeated calls."""

import pytest
import torch

from benchmarks.suite import call_profiles


def test_op_table_names_the_ops_of_the_profiled_calls():
    lines = call_profiles.op_table(lambda t: torch.relu(t @ t), torch.ones(4, 4), "cpu", calls=3)
    text = "\n".join(lines)
    assert "aten::relu" in text and "aten::mm" in text


def test_python_table_counts_each_call_of_the_profiled_function():
    def function_under_test(t):
        return t * 2

    lines = call_profiles.python_table(function_under_test, torch.ones(2), "cpu", calls=7)
    rows = [line for line in lines if "function_under_test" in line]
    assert rows and rows[0].split()[0] == "7"


def test_op_table_ranks_by_the_column_asked_for():
    lines = call_profiles.op_table(lambda t: torch.relu(t @ t), torch.ones(4, 4), "cpu", calls=2,
                                   sort_by="cpu_time_total")
    assert any("aten::mm" in line for line in lines)
    with pytest.raises(AttributeError):  # the key reaches torch.profiler's table (no silent default)
        call_profiles.op_table(lambda t: t * 2, torch.ones(2), "cpu", calls=1, sort_by="no_such_column")


def test_table_totals_are_per_call_and_read_every_unit():
    lines = ["--- table ---", "Self CPU time total: 195.092ms", "Self CUDA time total: 108374.0us"]
    assert call_profiles.table_totals(lines, calls=200) == pytest.approx({"cpu_ms": 0.97546, "cuda_ms": 0.54187})
    assert call_profiles.table_totals(["Self CPU time total: 1.5s"], calls=3) == pytest.approx({"cpu_ms": 500.0})


def test_table_totals_of_a_real_table_match_the_profiled_calls():
    lines = call_profiles.op_table(lambda t: torch.relu(t @ t), torch.ones(64, 64), "cpu", calls=4)
    totals = call_profiles.table_totals(lines, calls=4)
    assert set(totals) == {"cpu_ms"} and totals["cpu_ms"] > 0
