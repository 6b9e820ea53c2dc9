"""`AOTIPackageBackend`: a package made once (module-scoped: one AOTInductor compile on the CPU, about 12 s) serves
unseen inputs, reads the module's live weights, refits after a replaced tensor, and refuses a damaged file or a
changed structure with the reason."""

from __future__ import annotations

import shutil

import pytest
import torch
from backend_models import MLP, mlp_call, record

from aitune_core.aoti_packaging import compile_package
from aitune_core.backends.aoti_package import (
    AOTIPackageBackend,
    AOTIPackageBackendConfig,
    file_sha256,
    structure_of,
)
from aitune_core.errors import BackendBuildError, BackendStateError

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(folder, package path, digest, graph spec, samples) of one MLP's package."""
    folder = tmp_path_factory.mktemp("aoti")
    module = MLP().eval()
    spec, samples = record(module, mlp_call)
    path = folder / "mlp.pt2"
    digest = compile_package(module, spec, samples, CPU, path)
    return folder, path, digest, spec, samples


def _backend(made, module, path=None, digest=None):
    folder, package, sha, spec, samples = made
    backend = AOTIPackageBackend(AOTIPackageBackendConfig(package=str(path or package), sha256=digest or sha))
    return backend.build(module, spec, samples, CPU, folder)


def _fresh_mlp():
    torch.manual_seed(0)
    return MLP().eval()


@pytest.mark.slow
def test_a_package_serves_unseen_inputs_with_the_modules_weights(made):
    module = _fresh_mlp()  # not the module it was made from: the weights are bound, not packaged
    backend = _backend(made, module)
    assert backend.is_active and backend.bakes_weights and "mlp.pt2" in backend.describe()
    x = torch.randn(7, 32)  # batch 7: inside the recorded 2..8, never seen
    with torch.no_grad():
        torch.testing.assert_close(backend(x), module(x))
        module.fc2.weight.mul_(3)  # in place (load_state_dict does this): seen at once
        torch.testing.assert_close(backend(x), module(x))


@pytest.mark.slow
def test_a_replaced_weight_is_bound_by_refit_and_a_changed_structure_is_refused(made):
    module = _fresh_mlp()
    backend = _backend(made, module)
    x = torch.randn(4, 32)
    with torch.no_grad():
        module.fc2.weight = torch.nn.Parameter(torch.randn_like(module.fc2.weight))
        assert not torch.allclose(backend(x), module(x))  # why the module watch blocks it until the refit
        backend.refit()
        torch.testing.assert_close(backend(x), module(x))
        module.fc1 = torch.nn.Linear(32, 64, bias=False)  # another configuration of the layer
        with pytest.raises(BackendBuildError, match="structure changed"):
            backend.refit()


@pytest.mark.slow
def test_a_damaged_or_edited_package_is_refused_before_it_is_loaded(made, tmp_path):
    _folder, package, digest, _spec, _samples = made
    copy = tmp_path / "copy.pt2"
    shutil.copy(package, copy)
    assert file_sha256(copy) == digest
    with copy.open("r+b") as handle:  # truncated
        handle.truncate(copy.stat().st_size // 2)
    with pytest.raises(BackendBuildError, match="SHA-256"):
        _backend(made, _fresh_mlp(), path=copy)
    with pytest.raises(BackendBuildError, match="no package"):
        _backend(made, _fresh_mlp(), path=tmp_path / "missing.pt2")


@pytest.mark.slow
def test_deactivate_and_activate_load_the_package_again(made):
    module = _fresh_mlp()
    backend = _backend(made, module)
    backend.deactivate()
    with pytest.raises(BackendStateError):
        backend(torch.randn(2, 32))
    backend.activate()
    x = torch.randn(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(backend(x), module(x))


def test_structure_names_each_modules_class_and_configuration():
    module = _fresh_mlp()
    before = structure_of(module)
    assert ("fc1", "Linear", "in_features=32, out_features=64, bias=True") in before
    module.fc2 = torch.nn.Linear(64, 16)  # the same class and configuration: the same structure
    assert structure_of(module) == before
    module.fc2 = torch.nn.Linear(64, 8)
    assert structure_of(module) != before


def test_the_config_holds_strings_only():
    with pytest.raises(TypeError):
        AOTIPackageBackendConfig(package=3)  # type: ignore[arg-type]
    assert AOTIPackageBackendConfig(package="a.pt2", sha256="ab").key() != AOTIPackageBackendConfig().key()
