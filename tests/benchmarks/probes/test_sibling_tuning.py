"""benchmarks/probes/sibling_tuning.py: the summary (medians, ratio to the smallest block count) and its table.

The probe's cases compile with Inductor for a minute or more each; they are run by the probe itself (its result
JSON under benchmarks/results/), not here.
"""

from __future__ import annotations

from benchmarks.probes import sibling_tuning


def _run(scenario: str, blocks: int, seconds: float, **extra: object) -> dict[str, object]:
    return {"scenario": scenario, "blocks": blocks, "time_to_tuned_s": seconds, "tuning_s": seconds - 0.1,
            "strategy_runs": 1, "reused_decisions": blocks - 1, "tuned_nodes": blocks, "tuned": ["Layer"],
            "settled": True, **extra}


def test_summary_takes_medians_and_the_ratio_to_the_first_block_count(capsys):
    rows = [_run("blocks", 1, 10.0), _run("blocks", 24, 25.0), _run("blocks", 1, 12.0), _run("blocks", 24, 21.0),
            _run("blocks", 1, 30.0), _run("blocks", 24, 23.0)]
    summary = sibling_tuning._summary(rows, ["blocks"], [1, 24])
    assert [(row["blocks"], row["time_to_tuned_s"], row["runs"]) for row in summary] == [(1, 12.0, 3), (24, 23.0, 3)]
    assert summary[0]["ratio"] == 1.0 and summary[1]["ratio"] == round(23.0 / 12.0, 3)
    assert summary[1]["reused_decisions"] == 23
    sibling_tuning._table(summary)
    assert "1.92x" in capsys.readouterr().out


def test_a_failed_case_is_reported_not_hidden(capsys):
    rows = [_run("root", 1, 10.0), {"scenario": "root", "blocks": 24, "error": "boom"}]
    summary = sibling_tuning._summary(rows, ["root"], [1, 24])
    assert summary[1] == {"scenario": "root", "blocks": 24, "error": True}
    sibling_tuning._table(summary)
    assert "failed" in capsys.readouterr().out


def test_tuning_seconds_add_up_what_the_history_reports():
    history = ["No graph breaks in Block. Checking took 0.25s", "Tuning Block took 15.50s: TorchInductorBackend()",
               "Block graph 0: reused the decision of M.blocks.0: X; built and validated in 0.50s",
               "Tuning Head failed after 2s: NotFasterThanEagerError", "New child module: Linear"]
    assert sibling_tuning.tuning_seconds(history) == 18.25
