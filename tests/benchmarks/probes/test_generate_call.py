"""benchmarks/probes/generate_call.py: one request is a whole greedy generate() of a fixed length."""

from __future__ import annotations

import pytest
import torch

from benchmarks.probes import generate_call, tree_ab

pytest.importorskip("transformers")


def test_a_request_generates_the_fixed_number_of_tokens_after_the_prompt_and_repeats_itself():
    model, request = generate_call.build(torch.device("cpu"))
    assert model.config.n_layer == 12  # real depth: the cache a step passes holds 12 layers
    first, second = request(), request()
    assert first.shape == (1, generate_call.PROMPT + generate_call.NEW_TOKENS)
    assert torch.equal(first, second)


def test_tree_ab_times_a_generate_call_for_that_model_name():
    request = tree_ab._request(generate_call.NAME, 1, torch.device("cpu"))
    assert request().shape[1] == generate_call.PROMPT + generate_call.NEW_TOKENS
