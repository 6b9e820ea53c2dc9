"""samples_generator: collation of tensor / tuple / dict / Dataset samples into each batch size."""

from collections import namedtuple

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from aitune_aot.samples import collate, samples_generator


def _samples(n, shape=(3,)):
    return [torch.full(shape, float(i)) for i in range(n)]


def test_tensor_samples_are_stacked_per_batch_size():
    out = list(samples_generator(_samples(4), batch_sizes=[1, 2, 4]))
    assert [bs for bs, _, _ in out] == [1, 1, 1, 1, 2, 2, 4]
    for bs, args, kwargs in out:
        assert kwargs == {}
        assert len(args) == 1 and args[0].shape == (bs, 3)
    # consecutive samples, in order
    assert torch.equal(out[4][1][0][:, 0], torch.tensor([0.0, 1.0]))
    assert torch.equal(out[5][1][0][:, 0], torch.tensor([2.0, 3.0]))


def test_tuple_samples_become_positional_args_and_equal_constants_pass_through():
    dataset = [(torch.ones(2), torch.zeros(2, 5), 7) for _ in range(3)]
    ((bs, args, kwargs),) = list(samples_generator(dataset, batch_sizes=[3]))
    assert bs == 3 and kwargs == {}
    assert args[0].shape == (3, 2) and args[1].shape == (3, 2, 5) and args[2] == 7


def test_dict_samples_become_kwargs_and_nested_values_collate():
    dataset = [{"x": torch.randn(4), "extra": {"mask": torch.ones(4, dtype=torch.bool)}, "flag": True}] * 2
    ((_, args, kwargs),) = list(samples_generator(dataset, batch_sizes=[2]))
    assert args == ()
    assert kwargs["x"].shape == (2, 4)
    assert kwargs["extra"]["mask"].shape == (2, 4) and kwargs["extra"]["mask"].dtype == torch.bool
    assert kwargs["flag"] is True


def test_map_style_dataset_and_iterable_dataset():
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return torch.tensor([float(i * i)])

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(_samples(5, (2,)))

    out = list(samples_generator(Squares(), batch_sizes=[2]))
    assert [args[0].tolist() for _, args, _ in out] == [[[0.0], [1.0]], [[4.0], [9.0]]]  # last partial batch dropped
    out = list(samples_generator(Stream(), batch_sizes=[1, 2]))
    assert [bs for bs, _, _ in out] == [1] * 5 + [2, 2]


def test_one_shot_generator_is_replayed_for_every_batch_size():
    out = list(samples_generator((t for t in _samples(2)), batch_sizes=[1, 2]))
    assert [bs for bs, _, _ in out] == [1, 1, 2]


def test_dataset_smaller_than_batch_is_repeated_and_limit_applies():
    out = list(samples_generator(_samples(3), batch_sizes=[8]))
    assert len(out) == 1 and out[0][1][0].shape == (8, 3)
    assert out[0][1][0][:, 0].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    out = list(samples_generator(_samples(10), batch_sizes=[1, 2], max_num_batches_per_batch_size=2))
    assert [bs for bs, _, _ in out] == [1, 1, 2, 2]


def test_namedtuple_sample_is_one_argument():
    Pair = namedtuple("Pair", "a b")
    ((_, args, _),) = list(samples_generator([Pair(torch.ones(1), torch.ones(2))] * 2, batch_sizes=[2]))
    assert isinstance(args[0], Pair) and args[0].b.shape == (2, 2)


@pytest.mark.parametrize(
    ("dataset", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, "empty"),
        (iter([]), {}, ValueError, "empty"),
        (_samples(2), {"batch_sizes": []}, ValueError, "batch_sizes is empty"),
        (_samples(2), {"batch_sizes": [0]}, ValueError, ">= 1"),
        (_samples(2), {"batch_sizes": [1.5]}, TypeError, "ints"),
        (_samples(2), {"max_num_batches_per_batch_size": 0}, ValueError, "max_num_batches"),
        ({"x": torch.ones(1)}, {}, TypeError, r"\[sample\]"),
        (42, {}, TypeError, "sequence of samples"),
    ],
)
def test_invalid_arguments_fail_at_call_time(dataset, kwargs, error, match):
    with pytest.raises(error, match=match):
        samples_generator(dataset, **kwargs)


def test_collation_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"stack sample\[1\]\['x'\].*pad samples"):
        list(samples_generator([(1, {"x": torch.ones(2)}), (1, {"x": torch.ones(3)})], batch_sizes=[2]))
    with pytest.raises(ValueError, match=r"sample\[1\]: non-tensor values differ .*1 vs 2"):
        collate([(torch.ones(1), 1), (torch.ones(1), 2)])
    with pytest.raises(ValueError, match="different structures"):
        list(samples_generator([torch.ones(2), {"x": torch.ones(2)}], batch_sizes=[2]))
