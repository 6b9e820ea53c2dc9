"""Arguments with gaps in their memory, packed before a compiled graph sees them.

Why: a program that slices its inputs (`ids[:, :length]`, a crop of an image batch) passes tensors whose rows
have gaps between them. The recorded calls own clones of their arguments, and a clone of such a tensor is packed
(contiguous), so every graph is compiled, warmed up and validated on packed tensors, and dynamo's guards on the
strides fail on every sliced call: each ran the original forward, three re-tunes on the same packed samples could
not help, and then the backend compiled inside the program's calls (a small BERT on this project's CPU: about
1.9 s per such call in blocking mode). A packed copy computes the same values, so the serving path passes one
instead (`pack`). Not for a graph whose calls change their arguments (the change would land in the copy), and
only for tensors passed directly as arguments (not inside lists or dicts). Tensors without gaps keep their layout
(a transposed or channels-last tensor is cloned with its strides, and its graph compiled for them). An output
that is a view of such an argument is a view of the copy: equal values, not the same memory.
"""

from __future__ import annotations

from typing import Any

import torch


def gapped(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s elements do not fill one block of memory (a slice across rows, an expanded tensor): the
    tensors that `clone()` packs."""
    if tensor.is_contiguous():
        return False
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last):
        return False
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(tensor.stride(), tensor.shape) if n != 1):
        if stride != expected:
            return True
        expected *= size
    return False


def pack(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`args` / `kwargs` with every gapped tensor argument replaced by a packed copy; the same objects when there is
    none (the common case costs one `is_contiguous()` per tensor argument)."""
    if any(type(a) is torch.Tensor and not a.is_contiguous() for a in args):
        args = tuple(a.contiguous() if type(a) is torch.Tensor and gapped(a) else a for a in args)
    if any(type(v) is torch.Tensor and not v.is_contiguous() for v in kwargs.values()):
        kwargs = {k: v.contiguous() if type(v) is torch.Tensor and gapped(v) else v for k, v in kwargs.items()}
    return args, kwargs
