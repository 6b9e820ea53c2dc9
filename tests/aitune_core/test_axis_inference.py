import pytest

from aitune_core.specs.axis_inference import BatchEvidence, ShapeTracker, implied_batch_size, infer_axes


def test_seed_example():
    assert infer_axes([[1, 10, 512], [2, 50, 512]], [1, 2]) == ("batch0", "dim1", 512)


def test_single_observation_is_static():
    assert infer_axes([[4, 3, 224, 224]], [4]) == (4, 3, 224, 224)
    assert infer_axes([[4, 3]]) == (4, 3)


def test_one_batch_size_gives_no_batch_axis():
    # the axis varies (sequence length) but batch never does: dynamic, not batch
    assert infer_axes([[2, 10], [2, 20]], [2, 2]) == (2, "dim1")


def test_proportional_axis_is_batch():
    # a flattened [batch * 8] axis follows batch with ratio 8
    assert infer_axes([[8, 3], [16, 3], [32, 3]], [1, 2, 4]) == ("batch0", 3)


def test_axis_that_breaks_proportionality_becomes_dynamic():
    assert infer_axes([[1, 5], [2, 10], [4, 12]], [1, 2, 4]) == ("batch0", "dim1")


def test_unknown_batch_uses_leading_axis_heuristic():
    assert infer_axes([[1, 10], [3, 10], [2, 7]]) == ("batch0", "dim1")
    assert infer_axes([[1, 10], [1, 12]]) == (1, "dim1")


def test_known_batch_sizes_win_over_heuristic():
    # leading axis varies but the published batch size does not: dynamic
    assert infer_axes([[1, 4], [2, 4]], [8, 8]) == ("dim0", 4)


def test_rank_change_is_an_error():
    with pytest.raises(ValueError, match="rank"):
        infer_axes([[1, 2], [1, 2, 3]])
    with pytest.raises(ValueError):
        infer_axes([])


def test_implied_batch_size():
    assert implied_batch_size([(4, 3), (4,), (4, 7, 7)]) == 4
    assert implied_batch_size([(4, 3), (5, 3)]) is None
    assert implied_batch_size([(4, 3), ()]) is None
    assert implied_batch_size([]) is None


def test_evidence_heuristic_is_off_after_one_disagreement():
    ev = BatchEvidence()
    ev.observe(None, 1)
    ev.observe(None, 2)
    assert ev.mode == "implied"
    ev.observe(None, None)
    assert ev.mode is None


def test_tracker_reports_changes():
    tr = ShapeTracker([2, 3])
    assert tr.observe([2, 3], 2, None) is False
    assert tr.observe([4, 3], 4, None) is True
    assert tr.observe([3, 3], 3, None) is False  # inside the range, still proportional
    assert tr.min_shape == [2, 3] and tr.max_shape == [4, 3]
    assert tr.axes("known") == ("batch0", 3)
    assert tr.axes(None) == ("dim0", 3)
