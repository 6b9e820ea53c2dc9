"""aitune_core/import_patches.py: attributes replaced in named modules as each is imported (or at once where it
already is), only between install and uninstall, and put back unless someone replaced them since."""

from __future__ import annotations

import importlib
import sys

import pytest

from aitune_core.import_patches import ImportPatches


@pytest.fixture
def late_module(tmp_path, monkeypatch):
    (tmp_path / "aitune_late_patched.py").write_text("VALUE = 'original'\nOTHER = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "aitune_late_patched"
    sys.modules.pop("aitune_late_patched", None)


def test_a_module_imported_after_install_is_patched_and_put_back(late_module):
    patches = ImportPatches(lambda: (late_module,), lambda module: {"VALUE": "patched"})
    patches.install()
    patches.install()  # (idempotent)
    assert late_module not in sys.modules  # (install imports nothing)
    module = importlib.import_module(late_module)
    assert module.VALUE == "patched" and patches.patched() == [(late_module, "VALUE")]
    patches.uninstall()
    assert module.VALUE == "original" and patches.patched() == []


def test_an_imported_module_is_patched_at_once_and_nothing_after_uninstall(late_module):
    module = importlib.import_module(late_module)
    patches = ImportPatches(lambda: (late_module,), lambda m: {} if m.OTHER == 2 else {"VALUE": "patched"})
    patches.install()
    assert module.VALUE == "patched"
    patches.uninstall()
    module.OTHER = 2  # (the replacements decide per module: here, nothing)
    patches.install()
    assert module.VALUE == "original" and patches.patched() == []
    patches.uninstall()


def test_a_newer_replacement_of_someone_else_is_left_in_place(late_module):
    module = importlib.import_module(late_module)
    patches = ImportPatches(lambda: (late_module,), lambda m: {"VALUE": "patched"})
    patches.install()
    module.VALUE = "someone else's"
    patches.uninstall()
    assert module.VALUE == "someone else's"
