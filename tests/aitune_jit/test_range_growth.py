"""Ranges that grow: a tuned graph whose calls keep falling outside its ranges is tuned again over the wider range."""

from __future__ import annotations

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit import summary
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.range_growth import MAX_RETUNES, RangeGrowth
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


def _setup(after: int) -> None:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.retune_after_misses = after


def _call(model: torch.nn.Module, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, 32, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        return model(x), x


def test_calls_outside_the_range_lead_to_a_wider_tuned_graph():
    _setup(after=3)
    model = make_mlp()
    enable()
    for batch in (2, 3):  # tuned over batch 2..3
        _call(model, batch)
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED and CountingBackend.builds == 1
    for batch in (6, 8, 5):  # outside: eager, recorded; the third makes the graph due
        out, x = _call(model, batch)
        torch.testing.assert_close(out, type(model).forward(model, x))
    assert CountingBackend.builds == 2  # tuned again over batch 2..8
    assert any("tuning it again over" in line and "2..8" in line for line in PatchedModule.history)
    spec, _backend = node.dispatcher.entries[0]
    assert spec.input_spec.tensors[0].max_shape[0] == 8 and len(node.dispatcher.entries) == 1
    served = CountingBackend.infers
    for batch in (4, 7, 8):
        out, x = _call(model, batch)
        torch.testing.assert_close(out, type(model).forward(model, x))
    assert CountingBackend.infers == served + 3  # all served by the re-tuned backend
    assert node.fallbacks == 3 and "eager_fallbacks=3" in str(node)
    assert any("3 call(s) outside the tuned shape ranges ran eagerly" in line for line in summary.summary_lines())


def test_zero_never_tunes_again():
    _setup(after=0)
    model = make_mlp()
    enable()
    for batch in (2, 3, 6, 7, 8, 9, 10):
        _call(model, batch)
    assert CountingBackend.builds == 1 and PatchedModule.of(model).fallbacks == 5


def test_re_tuning_is_bounded():
    growth = RangeGrowth()
    jit_config.retune_after_misses = 1
    for _ in range(MAX_RETUNES):
        assert growth.missed("0")
        growth.retuned("0")
    assert not growth.missed("0") and growth.total == MAX_RETUNES + 1


def test_the_out_of_range_warning_is_shown_once_across_re_tunes(caplog):
    import logging

    _setup(after=2)
    model = make_mlp()
    enable()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        for batch in (2, 3, 6, 7, 12, 13):  # tuned over 2..3, again over 2..7, then 12 and 13 fall outside again
            _call(model, batch)
    assert CountingBackend.builds >= 2
    warnings = [r for r in caplog.records if "does not match any tuned graph" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_headroom_serves_sizes_near_the_recorded_range_without_re_tuning():
    _setup(after=3)
    model = make_mlp()
    enable()
    for batch in (3, 5):  # recorded 3..5, served 2..8
        _call(model, batch)
    assert CountingBackend.builds == 1
    served = CountingBackend.infers
    for batch in (2, 7, 8):
        out, x = _call(model, batch)
        torch.testing.assert_close(out, type(model).forward(model, x))
    assert CountingBackend.infers == served + 3 and PatchedModule.of(model).fallbacks == 0
    _call(model, 9)  # beyond the power of two: the original module
    assert PatchedModule.of(model).fallbacks == 1


def test_without_headroom_only_the_recorded_range_is_served():
    _setup(after=0)
    jit_config.range_headroom = False
    model = make_mlp()
    enable()
    for batch in (3, 5, 2, 7):
        _call(model, batch)
    assert PatchedModule.of(model).fallbacks == 2


def test_a_retune_over_lengths_is_not_held_back_by_min_samples_varying():
    """Tuned at one length, then three other lengths (misses): the re-tune runs though the graph now varies and
    has fewer than `min_samples_varying` calls."""
    _setup(after=3)
    jit_config.min_samples_varying = 8
    torch.manual_seed(0)
    model = torch.nn.Embedding(64, 32).eval()
    enable()
    with torch.no_grad():
        for length in (16, 16, 20, 24, 28):
            model(torch.randint(0, 64, (1, length)))
    assert CountingBackend.builds == 2  # tuned at length 16, then again over 16..28


def test_calls_that_missed_the_compiled_code_are_kept_twice_per_tuning():
    from aitune_jit.range_growth import MISSED_SAMPLES

    growth = RangeGrowth()
    assert [growth.keep_missed("0") for _ in range(MISSED_SAMPLES + 1)] == [True] * MISSED_SAMPLES + [False]
    assert growth.keep_missed("1")  # per graph
    growth.retuned("0")
    assert growth.keep_missed("0")
