"""`PrecompiledBackend`: a function precompiled once (module-scoped: one Inductor compile on the CPU) serves unseen
inputs in the call's own form with the module's live weights, answers calls its guards reject with the original
forward, refuses a damaged file or a changed structure with the reason, and refuses at build a function whose
guards reject the recorded calls."""

from __future__ import annotations

import shutil

import pytest
import torch
from backend_models import record

from aitune_core.backends.precompiled import FORMAT, PrecompiledBackend, PrecompiledBackendConfig, read_precompiled
from aitune_core.errors import BackendBuildError, BackendStateError
from aitune_core.precompiling import make_precompiled

CPU = torch.device("cpu")


class Scored(torch.nn.Module):
    """A keyword argument, a Python constant and a dict output: the call's own form must survive. Its activation
    is a builtin held by an attribute, which dynamo guards by identity (a guard the file cannot keep)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)
        self.act = torch.relu

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
        hidden = self.act(self.fc1(x)) * mask.unsqueeze(-1)
        return {"logits": self.fc2(hidden) * scale, "hidden": hidden}


def scored_call(batch: int):
    return (torch.randn(batch, 16),), {"mask": (torch.rand(batch) > 0.3).float(), "scale": 2.0}


def _fresh() -> Scored:
    torch.manual_seed(0)
    return Scored().eval()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(folder, file, digest, graph spec, samples) of one module's precompiled function."""
    folder = tmp_path_factory.mktemp("precompiled")
    module = _fresh()
    spec, samples = record(module, scored_call)
    path = folder / "scored.aotc"
    digest = make_precompiled(module, spec, samples, CPU, path)
    return folder, path, digest, spec, samples


def _backend(made, module, path=None, digest=None, samples=None):
    folder, artifact, sha, spec, recorded = made
    backend = PrecompiledBackend(PrecompiledBackendConfig(artifact=str(path or artifact), sha256=digest or sha))
    return backend.build(module, spec, samples or recorded, CPU, folder)


def _check(backend, module, batch: int = 5, scale: float = 2.0) -> None:
    x, mask = torch.randn(batch, 16), torch.ones(batch)
    with torch.no_grad():
        out, ref = backend(x, mask=mask, scale=scale), module(x, mask=mask, scale=scale)
    assert set(out) == {"logits", "hidden"}
    for name in ref:
        torch.testing.assert_close(out[name], ref[name])


@pytest.mark.slow
def test_it_serves_unseen_inputs_in_the_calls_form_with_the_modules_weights(made):
    module = _fresh()  # not the module it was made from: weights are read at each call
    backend = _backend(made, module)
    assert backend.is_active and backend.bakes_weights and "scored.aotc" in backend.describe()
    _check(backend, module, batch=7)  # inside the recorded 2..8, never seen
    with torch.no_grad():
        module.fc2.weight.mul_(3)  # in place: seen at once
    _check(backend, module, batch=3)
    assert backend.rejected_calls == 0


@pytest.mark.slow
def test_calls_its_guards_reject_are_answered_by_the_original_forward(made):
    module = _fresh()
    backend = _backend(made, module)
    _check(backend, module, scale=3.0)  # another constant than the one compiled in
    x, mask = torch.randn(4, 16), torch.ones(4)
    with torch.inference_mode():  # compiled under no_grad
        out, ref = backend(x, mask=mask, scale=2.0), module(x, mask=mask, scale=2.0)
    torch.testing.assert_close(out["logits"], ref["logits"])
    assert backend.rejected_calls == 2


@pytest.mark.slow
def test_a_changed_structure_is_refused_by_refit_and_a_replaced_weight_is_read(made):
    module = _fresh()
    backend = _backend(made, module)
    with torch.no_grad():
        module.fc2.weight = torch.nn.Parameter(torch.randn_like(module.fc2.weight))
    backend.refit()  # the same structure: nothing to bind
    _check(backend, module)
    module.fc1 = torch.nn.Linear(16, 32, bias=False)
    with pytest.raises(BackendBuildError, match="structure changed"):
        backend.refit()


@pytest.mark.slow
def test_a_function_attribute_set_after_it_was_built_is_seen(made):
    module = _fresh()
    backend = _backend(made, module)
    _check(backend, module)
    module.act = torch.sigmoid  # (the loaded function still holds relu: its identity guard was not saved)
    _check(backend, module)
    assert backend.changed_calls == 1 and backend.rejected_calls == 0
    with pytest.raises(BackendBuildError, match="a function the module holds changed"):
        backend.refit()
    module.act = torch.relu  # back: the function applies again
    backend.refit()
    _check(backend, module)
    assert backend.changed_calls == 1


@pytest.mark.slow
def test_a_damaged_file_or_recorded_calls_its_guards_reject_are_refused(made, tmp_path):
    _folder, artifact, _digest, _spec, samples = made
    copy = tmp_path / "copy.aotc"
    shutil.copy(artifact, copy)
    with copy.open("r+b") as handle:
        handle.truncate(copy.stat().st_size // 2)
    with pytest.raises(BackendBuildError, match="SHA-256"):
        _backend(made, _fresh(), path=copy)
    with pytest.raises(BackendBuildError, match="no precompiled function"):
        _backend(made, _fresh(), path=tmp_path / "missing.aotc")
    for sample in samples:  # recorded calls none of its functions was compiled for
        sample.kwargs["scale"] = 5.0
    try:
        with pytest.raises(BackendBuildError, match="guards reject every recorded call"):
            _backend(made, _fresh())
    finally:
        for sample in samples:
            sample.kwargs["scale"] = 2.0


@pytest.mark.slow
def test_a_batch_of_one_gets_a_function_of_its_own(tmp_path):
    module = _fresh()
    spec, samples = record(module, scored_call, batch_sizes=(1, 8, 1, 8))  # dynamo specializes a size of 1
    path = tmp_path / "mixed.aotc"
    digest = make_precompiled(module, spec, samples, CPU, path)
    backend = PrecompiledBackend(PrecompiledBackendConfig(artifact=str(path), sha256=digest))
    backend.build(module, spec, samples, CPU, tmp_path)
    assert len(backend._functions) == 2
    for batch in (1, 5):
        _check(backend, module, batch=batch)
    assert backend.rejected_calls == 0


def test_a_file_of_another_layout_is_refused_with_the_reason():
    with pytest.raises(BackendBuildError, match="no header"):
        read_precompiled(b"\x80\x04torch pickle")
    with pytest.raises(BackendBuildError, match="not of format"):
        read_precompiled(b'{"format": 99}\n')
    header = b'{"format": %d, "functions": [{"modules": {}, "bytes": 4}]}\n' % FORMAT
    assert read_precompiled(header + b"abcd") == [({}, b"abcd")]
    with pytest.raises(BackendBuildError, match="describes its functions wrongly"):
        read_precompiled(header + b"abc")  # shorter than it says
    with pytest.raises(BackendBuildError, match="more than its header"):
        read_precompiled(header + b"abcde")


@pytest.mark.slow
def test_deactivate_and_activate_load_it_again(made):
    module = _fresh()
    backend = _backend(made, module)
    backend.deactivate()
    with pytest.raises(BackendStateError):
        backend(torch.randn(2, 16), mask=torch.ones(2), scale=2.0)
    backend.activate()
    _check(backend, module)


def test_the_config_holds_strings_only():
    with pytest.raises(TypeError):
        PrecompiledBackendConfig(artifact=3)  # type: ignore[arg-type]
    assert PrecompiledBackendConfig(artifact="a.aotc", sha256="ab").key() != PrecompiledBackendConfig().key()
