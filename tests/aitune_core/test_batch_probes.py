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


def test_a_probe_passes_the_largest_calls_own_free_scalar_values():
    """A free scalar's value is not in the spec (its marker matches any int): a probe built from the spec's
    constants passed the marker object to the forward."""
    from aitune_core.recording.graph_recorder import GraphRecorder

    class Stepped(torch.nn.Module):
        def forward(self, x, t):
            return x * t

    module = Stepped()
    recorder = GraphRecorder(module)
    for batch, t in ((2, 999), (8, 979)):
        x = torch.randn(batch, 4)
        recorder.record((x, t), {}, module(x, t), batch_size=batch)
    spec = recorder.graph_specs[0]
    assert spec.free_scalars() == ["t"]
    calls = batch_probes(with_headroom(spec), recorder.samples(spec), None)
    assert [args[0].shape[0] for args, _ in calls] == [4] and [args[1] for args, _ in calls] == [979]
