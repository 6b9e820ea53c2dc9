"""benchmarks/real_workloads/generation_patterns.py: each pattern runs plainly at CI size and keeps every call's
tokens and scores (the comparison under the JIT is tests/aitune_jit/test_real_workloads.py's)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.real_workloads import clock, generation_patterns

pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize("name,per_round", [("llama_chat", 3), ("llama_assisted", 1), ("t5_beams", 1),
                                            ("gpt2_sampling", 1)])
def test_a_pattern_keeps_the_tokens_and_scores_of_each_call(name, per_round):
    size = clock.SIZES["tiny"]
    result = generation_patterns.WORKLOADS[name](size, False, "cpu")
    assert len(result["tokens"]) == len(result["scores"]) == per_round * size.generate_calls
    assert len(result["times"]) == size.generate_calls
    assert all(0 < n <= size.new_tokens for n in result["new_tokens"]) or name == "t5_beams"
    assert all(s.dim() == 3 and s.dtype == torch.float32 for s in result["scores"])


def test_a_chat_turn_continues_the_previous_turns_sequence():
    size = clock.SIZES["tiny"]
    result = generation_patterns.llama_chat(size, False, "cpu")
    first, second = result["tokens"][0], result["tokens"][1]
    assert torch.equal(second[:, : first.shape[1]], first)  # turn 2's context starts with turn 1's whole sequence


def test_seeded_sampling_repeats_itself():
    size = clock.SIZES["tiny"]
    torch.manual_seed(0)  # (the same random weights, as workload.py's main seeds them)
    one = generation_patterns.gpt2_sampling(size, False, "cpu")
    torch.manual_seed(0)
    two = generation_patterns.gpt2_sampling(size, False, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(one["tokens"], two["tokens"]))
