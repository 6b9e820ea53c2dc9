"""benchmarks/real_workloads/correctness.py: how two greedy generations from one prompt are judged, and a run cut
short keeps the rows it finished."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from benchmarks.real_workloads import correctness

PROMPT = [5, 6, 7]


def _generation(steps: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and the scores rows that chose them (batch 1), after `PROMPT`."""
    scores = torch.tensor(steps).unsqueeze(1)
    tokens = torch.tensor([PROMPT + [int(row.argmax()) for row in scores[:, 0]]])
    return tokens, scores


def _result(*generations: tuple[torch.Tensor, torch.Tensor]) -> dict:
    return {"tokens": [g[0] for g in generations], "scores": [g[1] for g in generations]}


def test_identical_generations_agree_and_a_background_run_is_matched_by_prompt():
    first, second = _generation([[1.0, 3.0, 0.0]]), _generation([[4.0, 0.0, 1.0]])
    result = correctness.compare("gpt2", _result(first, second), _result(first, second, first, second), "bf16")
    assert result["ok"] and len(result["calls"]) == 4 and result["near_tie_flips"] == 0


def test_a_flip_between_two_nearly_equal_scores_is_a_near_tie_and_agrees():
    plain = _generation([[1.0, 2.00, 1.99], [3.0, 0.0, 0.0]])
    tuned = _generation([[1.0, 1.99, 2.00], [0.0, 0.0, 3.0]])  # the tie flips, then another context
    result = correctness.compare("gpt2", _result(plain), _result(tuned), "bf16")
    (call,) = result["calls"]
    assert not call["tokens_identical"] and call["divergence"]["first_differing_step"] == 0
    assert call["divergence"]["near_tie"] and call["agrees"] and result["ok"] and result["near_tie_flips"] == 1


def test_a_flip_with_a_clear_margin_or_wrong_scores_before_it_is_a_failure():
    plain = _generation([[1.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    clear = _generation([[1.0, 3.0, 0.0], [0.0, 0.0, 3.0]])  # step 1: plain's margin is 3.0
    result = correctness.compare("gpt2", _result(plain), _result(clear), "bf16")
    assert not result["ok"] and result["calls"][0]["divergence"]["first_differing_step"] == 1
    assert not result["calls"][0]["divergence"]["near_tie"]
    tie = _generation([[1.0, 2.00, 1.99], [3.0, 0.0, 0.0]])
    drifted = _generation([[9.0, 1.99, 2.00], [0.0, 0.0, 3.0]])  # scores off before the flip
    assert not correctness.compare("gpt2", _result(tie), _result(drifted), "bf16")["ok"]


def test_served_answers_are_judged_per_request_and_a_background_run_by_its_request():
    answers = [torch.ones(2, 4), torch.full((1, 4), 2.0)]
    plain = {"outputs": answers, "requests": 2}
    result = correctness.compare("embeddings", plain, {"outputs": answers * 2, "requests": 2}, "fp32")
    assert result["ok"] and len(result["calls"]) == 4
    wrong = {"outputs": [answers[0], answers[1] * 1.1], "requests": 2}
    judged = correctness.compare("embeddings", plain, wrong, "fp32")
    assert not judged["ok"] and [c["within_tolerance"] for c in judged["calls"]] == [True, False]
    reshaped = correctness.compare("vit", plain, {"outputs": [answers[0], torch.ones(2, 4)], "requests": 2}, "fp32")
    assert not reshaped["ok"] and reshaped["calls"][1]["closeness"] == "shapes differ"
    assert not correctness.compare("vit", plain, {"outputs": answers[:1], "requests": 2}, "fp32")["ok"]


def test_each_finished_workload_is_written_before_the_next_one_runs(tmp_path, monkeypatch):
    """A device call that runs out of time still leaves the workloads it finished (an H100 run of four real-size
    workloads lost all three it had finished when its time limit stopped the fourth)."""
    out = tmp_path / "result.json"

    def row(workload, args, scratch):
        if workload == "bart":
            raise KeyboardInterrupt  # (as a time limit's signal would stop it)
        return {"workload": workload, "ok": True, "error_lines": []}

    monkeypatch.setattr(correctness, "_row", row)
    monkeypatch.setattr(sys, "argv", ["correctness.py", "--workloads", "gpt2", "t5", "bart", "--device", "cpu",
                                      "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        correctness.main()
    written = json.loads(out.read_text())
    assert written["complete"] is False and [r["workload"] for r in written["rows"]] == ["gpt2", "t5"]


def test_scores_a_sampler_filtered_to_minus_infinity_count_as_no_error():
    want = torch.tensor([[1.0, -float("inf"), 2.0]])
    assert correctness._relative(want.clone(), want) == (0.0, 0.0)
    max_abs, rel = correctness._relative(torch.tensor([[1.0, -float("inf"), 2.5]]), want)
    assert max_abs == pytest.approx(0.5) and 0 < rel < 1
    assert correctness._relative(torch.tensor([[1.0, 0.0, 2.0]]), want) == (float("inf"), float("inf"))


def test_a_workload_that_keeps_outputs_and_object_state_is_compared_whole():
    plain = {"outputs": [torch.ones(2)], "entries": [torch.zeros(3)], "calls": 6, "times": [0.1]}
    same = {"outputs": [torch.ones(2) + 1e-7], "entries": [torch.zeros(3)], "calls": 6, "times": [9.0]}
    assert correctness.compare("appending", plain, same, "fp32")["ok"]
    assert not correctness.compare("appending", plain, {**same, "calls": 5}, "fp32")["ok"]
    assert not correctness.compare("appending", plain, {**same, "entries": [torch.ones(3)]}, "fp32")["ok"]
    assert not correctness.compare("appending", plain, {**same, "entries": []}, "fp32")["ok"]
