"""runtime: switching JIT tuning on does not import dynamo (1.3 s of start-up), and aitune's frames are still
marked for dynamo to skip as top frames once it is imported."""

from __future__ import annotations

import subprocess
import sys
import types

from aitune_jit import runtime


def test_importing_the_hook_does_not_import_dynamo():
    code = "import sys, aitune_jit.hook, aitune_jit.switch; print('torch._dynamo' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_frames_are_marked_when_dynamo_is_imported_later(monkeypatch):
    import wrapt

    registered = []
    monkeypatch.setattr(wrapt, "register_post_import_hook", lambda hook, name: registered.append((hook, name)))
    monkeypatch.delitem(sys.modules, runtime._EVAL_FRAME, raising=False)  # (put back after the test)

    def own_frame() -> None:
        pass

    runtime.skip_as_top_frame(own_frame)
    [(hook, name)] = registered  # nothing imported for it: a hook for when dynamo is
    assert name == runtime._EVAL_FRAME
    marked: list[types.CodeType] = []
    hook(types.SimpleNamespace(skip_code=marked.append))  # what the import of dynamo does
    assert marked == [own_frame.__code__]


def test_frames_are_marked_at_once_when_dynamo_is_loaded(monkeypatch):
    import torch._dynamo.eval_frame as eval_frame

    marked = []
    monkeypatch.setattr(eval_frame, "skip_code", marked.append)

    def own_frame() -> None:
        pass

    runtime.skip_as_top_frame(own_frame)
    assert marked == [own_frame.__code__]
