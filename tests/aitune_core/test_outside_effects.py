"""aitune_core/recording/outside_effects.py: a call that prints, logs, or changes a global or a class attribute
of the code its forwards come from is named; a pure call, a cache filled by shape, and another thread's printing
are not; the stand-ins for stdout, stderr and the log record factory are put back after every watch."""

from __future__ import annotations

import functools
import logging
import sys
import threading

import pytest
import torch
from torch import nn

from aitune_core.recording.outside_effects import OutsideEffects

CALLS = 0
SEEN: list[int] = []
CACHE: dict[int, torch.Tensor] = {}
TOTAL = torch.zeros(())
COUNTS: dict[str, object] = {"calls": 0, "seen": []}


class _Recorder:
    def __init__(self) -> None:
        self.maps: list[torch.Tensor] = []
        self.cache: dict[int, torch.Tensor] = {}


STORE = _Recorder()  # (an attention-map store: a global object whose list a forward appends to)
PAIRS = zip(range(3), range(3))  # (a script's global iterator the forward never touches)
_logger = logging.getLogger("tests.outside_effects")


class _Net(nn.Module):
    calls = 0

    def __init__(self, effect: str = "") -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.effect = effect

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global CALLS
        effect = self.effect
        if effect == "counter":
            CALLS += 1
        elif effect == "append":
            SEEN.append(x.shape[0])
        elif effect == "tensor":
            TOTAL.add_(1)
        elif effect == "class":
            type(self).calls += 1
        elif effect == "print":
            print("batch", x.shape[0])
        elif effect == "stderr":
            sys.stderr.write("note\n")
        elif effect == "log":
            _logger.warning("batch %d", x.shape[0])
        elif effect == "cache":
            CACHE.setdefault(x.shape[0], torch.ones(x.shape[0]))
        elif effect == "dict-counter":
            COUNTS["calls"] += 1
        elif effect == "dict-list":
            COUNTS["seen"].append(x.shape[0])
        elif effect == "store":
            STORE.maps.append(x.detach())
        elif effect == "store-cache":
            STORE.cache.setdefault(x.shape[0], x.detach())
        return self.fc(x)


def _decorated(forward):
    @functools.wraps(forward)
    def wrapper(self, x):
        return forward(self, x)

    return wrapper


class _Decorated(_Net):
    forward = _decorated(_Net.forward)


class _Outer(nn.Module):
    def __init__(self, effect: str) -> None:
        super().__init__()
        self.inner = _Net(effect)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


def _change(module: nn.Module, x: torch.Tensor | None = None) -> str | None:
    watch = OutsideEffects.before(module)
    module(torch.randn(2, 4) if x is None else x)
    return watch.changes()


@pytest.mark.parametrize(("effect", "words"), [
    ("counter", "`CALLS` of module "), ("append", "`SEEN`"), ("tensor", "`TOTAL`"),
    ("class", "`calls` of class _Net"), ("print", "prints or logs"), ("stderr", "prints or logs"),
    ("log", "prints or logs"), ("dict-counter", "`COUNTS['calls']` of module "), ("dict-list", "`COUNTS['seen']`"),
    ("store", "`STORE['maps']`"),
])
def test_each_effect_outside_the_module_is_named(effect, words, capsys):
    change = _change(_Net(effect))
    assert change is not None and words in change, (effect, change)
    assert _change(_Outer(effect)) is not None, "a submodule's effect is its parent's too"


def test_a_forward_behind_a_decorator_is_followed_to_the_globals_of_its_own_file():
    assert "`CALLS`" in (_change(_Decorated("counter")) or "")


def test_a_cache_kept_in_a_global_objects_dict_attribute_is_no_change():
    assert _change(_Net("store-cache")) is None


def test_an_untouched_global_iterator_is_no_change():
    assert PAIRS is not None and _change(_Net()) is None


def test_a_pure_call_a_cache_filled_by_shape_and_a_disabled_log_level_are_no_change(caplog):
    assert _change(_Net("")) is None
    assert _change(_Net("cache"), torch.randn(7, 4)) is None, "a cache keyed by shape: replays fill nothing new"
    with caplog.at_level(logging.ERROR, logger="tests.outside_effects"):
        _logger.setLevel(logging.ERROR)
        try:
            assert _change(_Net("log")) is None, "a record below the logger's level is never made"
        finally:
            _logger.setLevel(logging.NOTSET)


def test_the_streams_and_the_record_factory_are_put_back_and_print_reaches_the_program(capsys):
    stdout, stderr, factory, save = sys.stdout, sys.stderr, logging.getLogRecordFactory(), torch.save
    outer = OutsideEffects.before(_Net())
    inner = OutsideEffects.before(_Net())  # nested on the same thread: one stand-in
    assert sys.stdout is not stdout and torch.save is not save
    print("visible")
    assert inner.changes() == "prints or logs" and sys.stdout is not stdout
    assert outer.changes() == "prints or logs"
    assert (sys.stdout, sys.stderr, logging.getLogRecordFactory(), torch.save) == (stdout, stderr, factory, save)
    assert capsys.readouterr().out == "visible\n"


def test_a_watch_abandoned_after_a_raising_call_puts_everything_back():
    stdout = sys.stdout
    watch = OutsideEffects.before(_Net())
    watch.abandon()
    watch.abandon()
    assert sys.stdout is stdout and watch.changes() is None


def test_a_stream_the_program_set_meanwhile_is_kept(capsys):
    stdout = sys.stdout
    watch = OutsideEffects.before(_Net())
    mine = open("/dev/null", "w")  # noqa: SIM115
    try:
        sys.stdout = mine
        watch.changes()
        assert sys.stdout is mine
    finally:
        sys.stdout = stdout
        mine.close()


def test_another_threads_printing_is_not_the_calls_doing(capsys):
    watch = OutsideEffects.before(_Net())
    thread = threading.Thread(target=print, args=("from another thread",))
    thread.start()
    thread.join()
    _Net("")(torch.randn(2, 4))
    assert watch.changes() is None
    assert "from another thread" in capsys.readouterr().out


class _Writer(nn.Module):
    """Writes outside the process (a log file, a file made and removed, `torch.save`), or only reads."""

    def __init__(self, folder, how: str, child: nn.Module | None = None) -> None:
        super().__init__()
        self.folder, self.how, self.child = folder, how, child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "append":
            with open(self.folder / "log.txt", "a") as handle:
                handle.write("call\n")
        elif self.how == "save":
            torch.save(x, self.folder / "x.pt")
        elif self.how == "remove":
            (self.folder / "old.txt").write_text("x")
            (self.folder / "old.txt").unlink()
        elif self.how == "read":
            (self.folder / "in.txt").read_text()
        return self.child(x) if self.child is not None else x + 1


def _watched(module: nn.Module, x: torch.Tensor) -> str | None:
    watch = OutsideEffects.before(module)
    module(x)
    return watch.changes()


@pytest.mark.parametrize("how", ["append", "remove", "save"])
def test_a_forward_that_writes_a_file_is_named_by_its_audit_event(tmp_path, how):
    # before, each replay of tuning wrote again: a log file had 16 lines after 2 calls
    changed = _watched(_Writer(tmp_path, how), torch.ones(2))
    assert changed is not None and "writes outside the process" in changed
    assert {"append": "`open`", "remove": "`os.remove`", "save": "`torch.save`"}[how] in changed


def test_reading_a_file_is_no_change_and_a_parents_write_is_not_its_childs(tmp_path):
    (tmp_path / "in.txt").write_text("x")
    assert _watched(_Writer(tmp_path, "read"), torch.ones(2)) is None
    child = _Writer(tmp_path, "read")
    child_changes: list[str | None] = []

    class _Parent(nn.Module):
        def forward(self, x):
            with open(tmp_path / "log.txt", "a") as handle:  # the parent's write, before its child is watched
                handle.write("parent\n")
            watch = OutsideEffects.before(child)
            out = child(x)
            child_changes.append(watch.changes())
            return out

    assert "writes outside the process" in _watched(_Parent(), torch.ones(2))
    assert child_changes == [None]


def test_a_global_of_the_programs_own_helper_module_is_watched_and_a_librarys_is_not(tmp_path, monkeypatch):
    import importlib
    import textwrap

    (tmp_path / "aitune_test_helpers.py").write_text("CALLS = []\n\ndef record(x):\n    CALLS.append(x.shape[0])\n")
    (tmp_path / "aitune_test_model.py").write_text(textwrap.dedent("""
        import torch
        import aitune_test_helpers
        from aitune_test_helpers import record

        class ByModule(torch.nn.Module):
            def forward(self, x):
                aitune_test_helpers.record(x)
                return x * 2

        class ByFunction(torch.nn.Module):
            def forward(self, x):
                record(x)
                return torch.nn.functional.relu(x)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = importlib.import_module("aitune_test_model")
        for cls in (model.ByModule, model.ByFunction):
            change = _change(cls())
            assert change is not None and "`CALLS` of module aitune_test_helpers" in change, change
    finally:
        sys.modules.pop("aitune_test_model", None)
        sys.modules.pop("aitune_test_helpers", None)


def test_the_file_of_an_object_a_module_keeps_is_watched(tmp_path, monkeypatch):
    """An attention-processor-like object of the program's, handed to a module whose own file never imports its
    file, appends to a store in that file."""
    import importlib
    import textwrap

    (tmp_path / "aitune_test_store.py").write_text(textwrap.dedent("""
        STORE = []

        class Recording:
            def __call__(self, x):
                STORE.append(x.shape[0])
                return x
    """))
    (tmp_path / "aitune_test_holder.py").write_text(textwrap.dedent("""
        import torch

        class Holder(torch.nn.Module):
            def __init__(self, processor):
                super().__init__()
                self.processor = processor

            def forward(self, x):
                return self.processor(x) * 2
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        store = importlib.import_module("aitune_test_store")
        holder = importlib.import_module("aitune_test_holder")
        change = _change(holder.Holder(store.Recording()))
        assert change is not None and "`STORE` of module aitune_test_store" in change, change
    finally:
        sys.modules.pop("aitune_test_store", None)
        sys.modules.pop("aitune_test_holder", None)


class _DefaultCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0, log: list | None = None, *, _seen=[],  # noqa: B006
                _cache={}) -> torch.Tensor:  # noqa: B006
        if log is None:
            _seen.append(1)  # (a step count kept in a mutable default, across calls)
        else:
            _cache.setdefault(x.shape[0], x.detach())
        return self.fc(x) * scale * len(_seen)


def test_a_forward_that_changes_a_mutable_default_of_its_own_is_named():
    change = _change(_DefaultCounter())
    assert change is not None and "default _seen of the function `forward` of class _DefaultCounter" in change, change
    # a dict default is a dict like any other namespace's: filled by shape, it is no change
    assert _change(_DefaultCounter(), torch.randn(2, 4)) is not None  # (`_seen` grows again)
    module = _DefaultCounter()
    watch = OutsideEffects.before(module)
    module(torch.randn(3, 4), log=[])
    assert watch.changes() is None


_IDS = [0]


def _next_id(_n=[0]) -> int:  # noqa: B006 - a count kept in a default, as a program's helper may
    _n[0] += 1
    return _n[0]


def _counter():
    count = 0

    def step() -> int:
        nonlocal count
        count += 1
        return count

    return step


_STEP = _counter()


class _HelperState(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "default":
            _next_id()
        elif self.how == "closure":
            _STEP()
        elif self.how == "element":
            _IDS[0] += 1
        return self.fc(x)


@pytest.mark.parametrize(("how", "words"), [
    ("default", "default _n of the function `_next_id`"), ("closure", "closure count of the function `_STEP`"),
    ("element", "`_IDS[0]`"),
])
def test_a_count_in_a_helpers_default_or_closure_or_a_global_lists_item_is_named(how, words):
    # `def next_id(_n=[0]): _n[0] += 1` called from a forward read 17 after 8 calls under the JIT (sixth round)
    change = _change(_HelperState(how))
    assert change is not None and words in change, change


def test_numpy_and_byte_buffers_edited_in_place_are_a_change_of_the_module():
    np = pytest.importorskip("numpy")
    from aitune_core.recording.value_fingerprint import fingerprint

    for buffer, edit in ((np.zeros(1), lambda b: b.__iadd__(1)), (bytearray(b"ab"), lambda b: b.__setitem__(0, 1))):
        before = fingerprint(buffer)
        edit(buffer)
        assert fingerprint(buffer) != before, type(buffer)
    big = np.zeros(10_000)
    assert fingerprint(big) == fingerprint(big)  # (too large to read per call: its size only)


def test_writes_while_torch_compiles_and_dynamos_new_globals_are_no_change(tmp_path):
    # a program's own torch.compile of a submodule compiling inside a recorded call writes Inductor's caches and
    # installs dynamo's globals (`__builtins_dict___8`) where the compiled code lives: the root stayed eager
    from torch import _guards

    class _Compiling(nn.Module):
        def forward(self, x):
            context = _guards.CompileContext(_guards.CompileId(frame_id=0, frame_compile_id=0))
            with _guards.compile_context(context):
                (tmp_path / "cache.bin").write_bytes(b"code")
                logging.getLogger("torch._dynamo.test").warning("a graph break")  # (torch's, while it compiles)
            globals()["__builtins_dict___test"] = {}
            return x + 1

    try:
        assert _watched(_Compiling(), torch.ones(2)) is None
    finally:
        globals().pop("__builtins_dict___test", None)
    assert "writes outside the process" in (_watched(_Writer(tmp_path, "append"), torch.ones(2)) or "")


class _DecoratedDefault(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @_decorated
    def forward(self, x: torch.Tensor, _seen=[]) -> torch.Tensor:  # noqa: B006
        _seen.append(1)
        return self.fc(x) * len(_seen)


def test_a_default_of_a_decorated_forward_is_watched_through_the_wrapper():
    # the class holds the decorator's wrapper; the forward it wraps kept the list (593 entries after 30 calls
    # under the JIT in a reviewer's script)
    change = _change(_DecoratedDefault())
    assert change is not None and "default _seen of _DecoratedDefault.forward" in change, change
