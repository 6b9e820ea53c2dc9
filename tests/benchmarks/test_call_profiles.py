"""benchmarks/call_profiles.py: op and Python-function tables of repeated calls."""

import torch

import call_profiles


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
