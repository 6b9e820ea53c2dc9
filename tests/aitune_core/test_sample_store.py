import random

import pytest
import torch

from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.recording.sample import Sample
from aitune_core.recording.sample_store import SampleStore


def _sample():
    return Sample((), {})


def test_keeps_everything_until_full():
    store = SampleStore(3)
    for n in (1, 2, 3):
        assert store.offer([(n, 4)], n, _sample)
    assert len(store) == 3
    with pytest.raises(ValueError):
        SampleStore(0)


def test_bounded_and_keeps_extremes_after_1000_calls():
    rng = random.Random(0)
    store = SampleStore(8)
    made = 0

    def make():
        nonlocal made
        made += 1
        return _sample()

    shapes_seen = []
    for _ in range(1000):
        shapes = [(rng.randint(1, 16), rng.randint(5, 100), 32), (rng.randint(1, 16),)]
        shapes_seen.append(shapes)
        store.offer(shapes, None, make)
        assert len(store) <= 8
    assert len(store) == 8
    assert made < 200  # most calls were never copied
    kept = store.shapes()
    totals = [sum(a * b * c for a, b, c in [s[0]]) + s[1][0] for s in kept]
    all_totals = [s[0][0] * s[0][1] * s[0][2] + s[1][0] for s in shapes_seen]
    assert min(totals) == min(all_totals) and max(totals) == max(all_totals)
    for t, a in ((0, 0), (0, 1), (1, 0)):
        values = [s[t][a] for s in shapes_seen]
        kept_values = [s[t][a] for s in kept]
        assert min(kept_values) == min(values) and max(kept_values) == max(values)


def test_duplicates_are_dropped_without_copying():
    store = SampleStore(2)
    store.offer([(1, 4)], 1, _sample)
    store.offer([(8, 4)], 8, _sample)

    def fail():
        raise AssertionError("must not copy a call that is not kept")

    assert not store.offer([(4, 4)], 4, fail)  # inside the range: nothing new
    assert not store.offer([(8, 4)], 8, fail)
    assert store.shapes() == [((1, 4),), ((8, 4),)]


def test_new_extreme_replaces_least_useful():
    store = SampleStore(3)
    for n in (2, 3, 4):
        store.offer([(n,)], n, _sample)
    assert store.offer([(9,)], 9, _sample)
    # 2 holds the minimum, 9 the new maximum; 3 and 4 hold nothing and tie, so the newer (4) goes
    assert sorted(s[0][0] for s in store.shapes()) == [2, 3, 9]


def test_recorder_memory_is_bounded_and_specs_follow_every_call():
    model = torch.nn.Linear(4, 2)
    recorder = GraphRecorder(model, max_samples=3)
    sizes = [5, 1, 7, 3, 2, 9, 4, 4, 6, 8] * 100
    for n in sizes:
        x = torch.randn(n, 4)
        recorder.record((x,), {}, model(x))
    spec = recorder.graph_specs[0]
    assert recorder.num_samples(spec) == 1000
    assert len(recorder.samples(spec)) == 3
    assert spec.input_spec.tensors[0].min_shape == (1, 4)
    assert spec.input_spec.tensors[0].max_shape == (9, 4)
    kept = sorted(s.args[0].shape[0] for s in recorder.samples(spec))
    assert kept[0] == 1 and kept[-1] == 9


def test_a_call_offered_to_keep_is_stored_whatever_its_shapes_up_to_half_the_store():
    store = SampleStore(4)
    for n in (1, 2, 3, 8):
        store.offer([(n, 4)], n, _sample)
    assert not store.offer([(2, 4)], 2, _sample)  # nothing new in its shapes
    assert store.offer([(2, 4)], 2, _sample, keep=True)  # (a call that missed the compiled code: its layout is new)
    assert store.offer([(3, 4)], 3, _sample, keep=True)
    assert not store.offer([(3, 4)], 3, _sample, keep=True)  # half the store is kept calls already
    assert sorted(s[0][0] for s in store.shapes()) == [1, 2, 3, 8]  # the extremes stay
    for n in (9, 10):  # new extremes push out plain samples, never the kept ones
        store.offer([(n, 4)], n, _sample)
    assert sum(entry.kept for entry in store._entries) == 2
