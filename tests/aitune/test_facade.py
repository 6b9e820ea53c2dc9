"""The public facade: documented import paths work with the base dependencies alone, and layers import downward."""

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
OPTIONAL = ["torchao", "onnx", "onnxruntime", "onnxscript", "tensorrt", "torch_tensorrt", "transformers", "matplotlib"]


def test_import_with_base_dependencies_only():
    # a None entry in sys.modules makes `import x` raise ImportError, as if the package were not installed
    code = (
        "import sys\n"
        f"for name in {OPTIONAL!r}: sys.modules[name] = None\n"
        "import aitune.torch as ait\n"
        "from aitune.torch.backend import TensorRTBackend, TorchAOBackend, ONNXRuntimeBackend\n"
        "from aitune.torch.tune_strategy import FirstWinsStrategy\n"
        "import aitune.torch.jit\n"
        "print(ait.Module.__name__, ait.tune.__name__, ait.jit_config.min_samples)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Module tune ")


def _imported_packages(package: str) -> set[str]:
    found = set()
    for path in (SRC / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_layers_import_downward_only():
    assert not _imported_packages("aitune_core") & {"aitune", "aitune_aot", "aitune_jit"}
    assert not _imported_packages("aitune_jit") & {"aitune", "aitune_aot"}
    assert not _imported_packages("aitune_aot") & {"aitune", "aitune_jit"}
