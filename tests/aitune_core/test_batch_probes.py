"""Batch sizes a tuned range holds but no recorded call showed are compiled while the backend is built."""

from __future__ import annotations

import torch
from backend_models import MLP, mlp_call, record

from aitune_core.backends.batch_probes import batch_probes, probe_sizes
from aitune_core.specs.range_headroom import with_headroom


def test_the_ends_and_powers_of_two_between_them_less_what_was_recorded():
    assert probe_sizes(1, 32, {1, 32}) == [2, 4, 8, 16]
    assert probe_sizes(3, 12, set()) == [3, 4, 8, 12]
    assert probe_sizes(2, 2, {2}) == []


def test_calls_are_cut_or_repeated_from_the_largest_recorded_call():
    module = MLP().eval()
    spec, samples = record(module, mlp_call, batch_sizes=(2, 8))
    calls = batch_probes(with_headroom(spec), samples, None)
    sizes = [args[0].shape[0] for args, _kwargs in calls]
    assert sizes == [4] and all(args[0].shape[1] == 32 for args, _ in calls)
    largest = max(samples, key=lambda s: s.args[0].shape[0]).args[0]
    torch.testing.assert_close(calls[0][0][0], largest[:4])


def test_no_probes_for_a_static_graph_or_calls_that_change_their_arguments():
    module = MLP().eval()
    spec, samples = record(module, mlp_call, batch_sizes=(4, 4))
    assert batch_probes(spec, samples, None) == []
    spec, samples = record(module, mlp_call, batch_sizes=(2, 8))
    for sample in samples:
        sample.mutates_inputs = True
    assert batch_probes(spec, samples, None) == []
