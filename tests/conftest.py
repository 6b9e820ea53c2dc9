"""Suite-wide settings: keep Inductor's caches on and in one place so repeated compiles are cheap."""

import os
import tempfile
from pathlib import Path

_CACHE = Path(os.environ.get("AITUNE_TEST_CACHE", Path(tempfile.gettempdir()) / "aitune-test-inductor-cache"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_CACHE))
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
