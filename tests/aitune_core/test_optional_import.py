import pytest

from aitune_core.backends.optional_import import import_optional
from aitune_core.errors import BackendBuildError, BackendNotAvailableError


def test_present_module_is_returned():
    json_module = import_optional("json", "json", "unused")
    assert json_module.dumps([1]) == "[1]"


def test_missing_module_names_package_and_extra():
    with pytest.raises(BackendNotAvailableError) as info:
        import_optional("aitune_no_such_library_xyz", "no-such-lib", "someextra")
    assert str(info.value) == "no-such-lib is not installed; pip install 'aitune[someextra]'"
    # strategies treat it as a normal build failure
    assert isinstance(info.value, BackendBuildError)
