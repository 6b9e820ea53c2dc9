"""Patch: one replaced attribute, put back exactly - and only if nobody replaced it after us."""

from __future__ import annotations

from aitune_core.patch import Patch


class Base:
    def greet(self) -> str:
        return "base"


class Child(Base):
    @classmethod
    def make(cls) -> str:
        return "made"


def test_apply_and_restore_an_own_classmethod_exactly():
    own = Child.__dict__["make"]
    patch = Patch(Child, "make", classmethod(lambda cls: "patched")).apply()
    assert Child.make() == "patched" and patch.found() is own
    assert patch.restore() and Child.__dict__["make"] is own and Child.make() == "made"
    assert patch.restore()  # idempotent


def test_an_inherited_attribute_is_removed_again_not_copied_down():
    patch = Patch(Child, "greet", lambda self: "patched").apply()
    assert Child().greet() == "patched"
    assert patch.restore()
    assert "greet" not in Child.__dict__ and Child().greet() == "base"


def test_a_later_patch_is_left_in_place():
    patch = Patch(Base, "greet", lambda self: "ours").apply()
    theirs = lambda self: "theirs"  # noqa: E731
    Base.greet = theirs
    try:
        assert not patch.restore()
        assert Base.__dict__["greet"] is theirs
    finally:
        Base.greet = ORIGINAL_GREET


ORIGINAL_GREET = Base.__dict__["greet"]
