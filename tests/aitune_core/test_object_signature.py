"""object_signature: a cache object's layout separates prefill from decode, not one decode step from the next."""

from __future__ import annotations

import torch

from aitune_core.specs.object_signature import object_signature


class Layer:
    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.is_initialized = False
        self.layer_idx = 0


class Cache:
    def __init__(self, layers: int = 2) -> None:
        self.layers = [Layer() for _ in range(layers)]

    def fill(self, length: int) -> Cache:
        for layer in self.layers:
            layer.keys = torch.zeros(1, 2, length, 4)
            layer.is_initialized = True
        return self


def test_empty_and_filled_caches_differ():
    assert object_signature(Cache()) != object_signature(Cache().fill(3))


def test_lengths_and_counters_do_not_matter():
    a, b = Cache().fill(3), Cache().fill(9)
    b.layers[1].layer_idx = 7
    assert object_signature(a) == object_signature(b)


def test_layer_count_and_dtype_matter():
    assert object_signature(Cache(2).fill(3)) != object_signature(Cache(3).fill(3))
    half = Cache().fill(3)
    half.layers[0].keys = half.layers[0].keys.half()
    assert object_signature(half) != object_signature(Cache().fill(3))


def test_signature_is_a_short_stable_string_and_survives_cycles():
    cache = Cache().fill(2)
    cache.layers[0].owner = cache  # a reference cycle
    signature = object_signature(cache)
    assert isinstance(signature, str) and len(signature) == 12
    assert signature == object_signature(cache)
