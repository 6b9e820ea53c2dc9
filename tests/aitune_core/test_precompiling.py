"""`make_precompiled`: writes the whole file or none, returns its digest, and turns a graph break into a
`BackendBuildError` with the reason; `savable_guards` keeps only guards this torch can save and load."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from backend_models import MLP, mlp_call, record

from aitune_core import precompiling
from aitune_core.backends.aoti_package import file_sha256
from aitune_core.errors import BackendBuildError
from aitune_core.precompiling import _largest, make_precompiled, savable_guards

CPU = torch.device("cpu")


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a graph break: data-dependent control flow
            return self.fc(x)
        return -self.fc(x)


@pytest.mark.slow
def test_the_file_is_written_whole_and_its_digest_returned(tmp_path):
    module = MLP().eval()
    spec, samples = record(module, mlp_call)
    dest = tmp_path / "packages" / "mlp.aotc"
    digest = make_precompiled(module, spec, samples, CPU, dest)
    assert dest.is_file() and file_sha256(dest) == digest
    assert [p.name for p in dest.parent.iterdir()] == ["mlp.aotc"]  # no scratch file left beside it


def test_a_graph_break_fails_with_the_reason_and_leaves_no_file(tmp_path):
    module = Branchy().eval()
    spec, samples = record(module, mlp_call)
    dest = tmp_path / "branchy.aotc"
    with pytest.raises(BackendBuildError, match="precompiling failed"):
        make_precompiled(module, spec, samples, CPU, dest)
    assert not dest.exists() and not list(tmp_path.iterdir())


def test_the_largest_recorded_call_is_the_example():
    spec, samples = record(MLP().eval(), mlp_call, batch_sizes=(2, 8, 4))
    assert _largest(samples).args[0].shape[0] == 8
    with pytest.raises(BackendBuildError, match="no recorded call"):
        make_precompiled(MLP(), spec, [], CPU, Path("unused.aotc"))


def _guard(name: str, guard_type: str = "CONSTANT_MATCH", derived: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(name=name, guard_type=guard_type, derived_guard_types=derived)


@pytest.mark.parametrize("loads_defaults", [False, True])
def test_guards_torch_cannot_save_or_load_are_left_out(monkeypatch, loads_defaults):
    """Torch 2.11 saves guards on functions' default values but fails to load them (every transformers model)."""
    monkeypatch.setattr(precompiling, "DEFAULTS_GUARDS_LOAD", loads_defaults)
    entries = [
        _guard("L['x'].size()[0]", "TENSOR_MATCH"),
        _guard("G['torch'].relu", "ID_MATCH"),
        _guard("L['self'].act", "TYPE_MATCH", derived=("ID_MATCH",)),
        _guard("dict(type(L['m']).__dict__)['feed_forward_chunk'].__defaults__"),
        _guard("G['utils'].inspect.signature.__kwdefaults__['eval_str']"),
        _guard("L['defaults_of_mine']"),  # (a name that only contains the word)
    ]
    assert savable_guards(entries) == [True, False, False, loads_defaults, loads_defaults, True]

