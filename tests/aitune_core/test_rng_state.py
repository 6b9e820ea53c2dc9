"""rng_state: a generator object's state compares equal exactly until it draws; other values are no generators."""

from __future__ import annotations

import random

import pytest
import torch

from aitune_core.recording.rng_state import numpy_global_state, rng_state


def _moves(generator, draw) -> None:
    before = rng_state(generator)
    assert before is not None and before == rng_state(generator)  # (read twice, unchanged)
    draw()
    assert rng_state(generator) != before


def test_torch_and_python_generators_move_when_they_draw():
    torch_generator = torch.Generator().manual_seed(3)
    _moves(torch_generator, lambda: torch.rand(2, generator=torch_generator))
    python = random.Random(4)
    _moves(python, python.random)


def test_numpy_generators_and_the_global_stream_move_when_they_draw():
    np = pytest.importorskip("numpy")
    for generator in (np.random.default_rng(4), np.random.Generator(np.random.MT19937(5)),
                      np.random.RandomState(6)):
        _moves(generator, generator.random if hasattr(generator, "random") else generator.rand)
    before = numpy_global_state()
    assert before is not None and before == numpy_global_state()
    np.random.rand()
    assert numpy_global_state() != before


def test_other_values_are_no_generators():
    for value in (None, 3, "x", torch.ones(2), [torch.Generator()], object(), random):
        assert rng_state(value) is None
