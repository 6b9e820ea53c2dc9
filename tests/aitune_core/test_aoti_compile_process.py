"""The compile process's command line: two paths, else a usage message and status 2 (the compile itself is
covered by `test_aoti_package.py`, which makes a package through it)."""

from __future__ import annotations

from aitune_core import aoti_compile_process


def test_a_wrong_command_line_gets_the_usage_and_status_2(capsys):
    assert aoti_compile_process.main(["only-one"]) == 2
    assert "usage" in capsys.readouterr().err


def test_packages_keep_the_weights_out():
    assert aoti_compile_process.PACKAGE_OPTIONS == {"aot_inductor.package_constants_in_so": False}
