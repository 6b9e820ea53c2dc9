"""Turn a dataset of unbatched samples into batched `(batch_size, args, kwargs)` calls.

A sample is one of:
- a tensor: the single positional argument;
- a tuple or list: the positional arguments;
- a dict (any Mapping): the keyword arguments.

Samples are collated leaf by leaf (nested containers are walked with `aitune_core.specs.tree`): tensors
are stacked along a new first axis, and any other leaf (an int flag, a string) must be equal across the
batch and is passed as is.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from aitune_core.specs.tree import flatten, flatten_values, unflatten

__all__ = ["collate", "samples_generator", "validate_batch_sizes", "validate_max_num_batches"]


def validate_batch_sizes(batch_sizes: Iterable[int]) -> tuple[int, ...]:
    """Batch sizes as a tuple of distinct positive ints, in the given order."""
    if isinstance(batch_sizes, int):
        batch_sizes = (batch_sizes,)
    try:
        sizes = tuple(batch_sizes)
    except TypeError:
        raise TypeError(f"batch_sizes must be a sequence of ints, got {type(batch_sizes).__name__}") from None
    if not sizes:
        raise ValueError("batch_sizes is empty; give at least one batch size (two or more to detect the batch axis)")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"batch sizes must be ints, got {size!r} ({type(size).__name__})")
        if size < 1:
            raise ValueError(f"batch sizes must be >= 1, got {size}")
    return tuple(dict.fromkeys(sizes))


def validate_max_num_batches(max_num_batches_per_batch_size: int | None) -> int | None:
    value = max_num_batches_per_batch_size
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_num_batches_per_batch_size must be an int or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"max_num_batches_per_batch_size must be >= 1 or None, got {value}")
    return value


def _dataset_iter_factory(dataset: Any):
    """A callable returning a fresh iterator over the dataset's samples (each batch size starts anew)."""
    if isinstance(dataset, (str, bytes, Mapping)):
        raise TypeError(
            f"dataset must be a sequence of samples or a torch.utils.data.Dataset, got {type(dataset).__name__}"
            + ("; to pass one keyword-argument sample, use [sample]" if isinstance(dataset, Mapping) else "")
        )
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        length = len(dataset)
        if length == 0:
            raise ValueError("dataset is empty; give at least one sample")
        return lambda: (dataset[i] for i in range(length))
    if isinstance(dataset, Iterable):
        if iter(dataset) is dataset:
            # a one-shot iterator (e.g. a generator) cannot be replayed for every batch size
            cached = list(dataset)
            if not cached:
                raise ValueError("dataset is empty; give at least one sample")
            return lambda: iter(cached)
        return lambda: iter(dataset)
    raise TypeError(
        f"dataset must be a sequence of samples or a torch.utils.data.Dataset, got {type(dataset).__name__}"
    )


def collate(items: Sequence[Any]) -> Any:
    """Collate unbatched values of one structure into a batch: tensors stacked on a new axis 0.

    Structures are walked with `aitune_core.specs.tree` (tuples, lists, dicts, namedtuples, dataclasses...);
    every non-tensor leaf must be equal across the items.
    """
    first_leaves, treedef = flatten(items[0])
    columns: list[list[Any]] = [[leaf] for _, leaf in first_leaves]
    for item in items[1:]:
        leaves, item_treedef = flatten_values(item)
        if item_treedef != treedef:
            raise ValueError(
                "cannot collate samples of different structures (containers, keys, or tensor vs non-tensor values "
                "differ); every sample of a dataset must have the same layout"
            )
        for column, leaf in zip(columns, leaves):
            column.append(leaf)
    batched = []
    for (locator, first), column in zip(first_leaves, columns):
        where = f"sample{locator}"
        if isinstance(first, torch.Tensor):
            layouts = {(tuple(t.shape), t.dtype) for t in column}
            if len(layouts) != 1:
                raise ValueError(
                    f"cannot stack {where} into a batch: samples differ in shape/dtype "
                    f"{sorted(str(layout) for layout in layouts)}; pad samples to a common shape"
                )
            batched.append(torch.stack(column))
        else:
            for value in column[1:]:
                if type(value) is not type(first) or value != first:
                    raise ValueError(
                        f"cannot collate {where}: non-tensor values differ across samples ({first!r} vs {value!r}); "
                        "only tensors are stacked, other values must be equal"
                    )
            batched.append(first)
    return unflatten(treedef, batched)


def _as_call(batch: Any) -> tuple[tuple, dict]:
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        return tuple(batch), {}
    return (batch,), {}


def _batches(samples: Iterator[Any], batch_size: int) -> Iterator[list[Any]]:
    """Consecutive full batches; when the dataset is smaller than one batch, one batch filled by repetition."""
    produced = False
    while True:
        chunk = list(itertools.islice(samples, batch_size))
        if len(chunk) == batch_size:
            produced = True
            yield chunk
            continue
        if not produced and chunk:
            yield list(itertools.islice(itertools.cycle(chunk), batch_size))
        return


def samples_generator(
    dataset: Any,
    batch_sizes: Iterable[int] = (1, 2),
    max_num_batches_per_batch_size: int | None = None,
) -> Iterator[tuple[int, tuple, dict]]:
    """Yield `(batch_size, args, kwargs)` for every batch size, collating consecutive samples of the dataset.

    For each batch size the dataset is read from the start, in consecutive batches; an incomplete last
    batch is dropped, and a dataset smaller than a batch is repeated to fill one batch. At most
    `max_num_batches_per_batch_size` batches are produced per batch size (all by default).

    Arguments are validated when this function is called, not when iteration starts.
    """
    sizes = validate_batch_sizes(batch_sizes)
    limit = validate_max_num_batches(max_num_batches_per_batch_size)
    new_iter = _dataset_iter_factory(dataset)
    return _generate(new_iter, sizes, limit)


def _generate(new_iter, sizes: tuple[int, ...], limit: int | None) -> Iterator[tuple[int, tuple, dict]]:
    for batch_size in sizes:
        batches = _batches(new_iter(), batch_size)
        if limit is not None:
            batches = itertools.islice(batches, limit)
        count = 0
        for chunk in batches:
            args, kwargs = _as_call(collate(chunk))
            count += 1
            yield batch_size, args, kwargs
        if count == 0:
            raise ValueError("dataset is empty; give at least one sample")
