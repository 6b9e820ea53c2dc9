"""aitune_jit/callable_module.py: after `import aitune.torch.jit.enable` (or `.disable`), the package's `enable` and
`disable` are those submodules, and calling them still switches JIT tuning on and off."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import aitune.torch.jit.enable
import aitune.torch.jit as jit
assert jit.is_enabled()
jit.disable(); assert not jit.is_enabled()
jit.enable(); assert jit.is_enabled()
import aitune.torch.jit.disable
assert not jit.is_enabled()
jit.enable(); assert jit.is_enabled()
jit.disable(); assert not jit.is_enabled()
print("OK", type(jit.enable).__name__)
"""


def test_the_submodules_are_called_as_the_functions_of_their_names(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP" and not k.startswith("AITUNE_JIT_")}
    env["AITUNE_JIT_CACHE_DIR"] = str(tmp_path / "jit-cache")
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK CallableModule[enable]" in result.stdout
