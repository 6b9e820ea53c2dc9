"""inductor_options: a configuration names only known Inductor options with plain values, and one read from a
file only options that cannot name a program, a path or code."""

from __future__ import annotations

import pytest

from aitune_core.backends.backend import Backend
from aitune_core.backends.inductor_options import FILE_SAFE_OPTIONS, check_from_file, check_options
from aitune_core.backends.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig


def test_a_script_may_set_any_known_option_with_a_plain_value():
    check_options({"max_autotune": True, "cpp.cxx": "g++", "triton": {"cudagraphs": False}})
    with pytest.raises(ValueError, match="'max_autotun' is not an Inductor option"):
        check_options({"max_autotun": True})
    with pytest.raises(ValueError, match="must be a bool"):
        check_options({"post_grad_custom_post_pass": print})
    with pytest.raises(ValueError, match="must be a dict"):
        check_options(["max_autotune"])
    with pytest.raises(ValueError, match="not an Inductor option"):
        TorchInductorBackendConfig(options={"no_such_opt": 1})


def test_a_file_may_not_name_a_program_or_code():
    check_from_file({"max_autotune": True, "triton": {"cudagraphs": True}})
    for name, value in (("cpp.cxx", "/tmp/x.sh"), ("cuda.cutlass_dir", "/tmp"), ("disabled_passes", "x")):
        with pytest.raises(ValueError, match="not accepted from a file"):
            check_from_file({name: value})
    state = TorchInductorBackendConfig(options={"cpp.cxx": "g++"}).to_dict()  # fine in a script ...
    with pytest.raises(ValueError, match="not accepted from a file"):
        TorchInductorBackendConfig.from_dict(state)  # ... not read back from a file


def test_every_file_safe_option_is_an_inductor_option():
    from torch._inductor import list_options

    assert set(list_options()) >= FILE_SAFE_OPTIONS


def test_backends_that_load_code_files_are_never_restored_from_a_checkpoint():
    from aitune_core.backends.aoti_package import AOTIPackageBackend
    from aitune_core.backends.precompiled import PrecompiledBackend
    from aitune_core.checkpoint.backend_state import resolve_backend_class
    from aitune_core.errors import CheckpointError

    assert Backend.checkpointable and TorchInductorBackend.checkpointable
    for cls in (AOTIPackageBackend, PrecompiledBackend):
        assert not cls.checkpointable
        with pytest.raises(CheckpointError, match="never restored from a checkpoint"):
            resolve_backend_class(cls.__name__)
