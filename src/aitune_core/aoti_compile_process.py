"""The child process that compiles an exported program into an AOTInductor package:
`python -m aitune_core.aoti_compile_process PROGRAM PACKAGE`.

Why a process: the compile is seconds to minutes of Python (Inductor's lowering and code generation) and a C++
build. In the serving process it would take turns with the requests for the GIL; in a process of its own it runs
beside them. `aitune_core.aoti_packaging.compile_package` writes PROGRAM (`torch.export.save`) and starts this.
Weights stay out of the package (`aot_inductor.package_constants_in_so=False`): the loading process binds its own
module's tensors (`backends/aoti_package.py`).
"""

from __future__ import annotations

import sys

#: Inductor options of every package aitune makes
PACKAGE_OPTIONS = {"aot_inductor.package_constants_in_so": False}


def compile_program(program: str, package: str) -> None:
    """Load the exported program at `program` and write its AOTInductor package to `package`."""
    import torch

    exported = torch.export.load(program)
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(exported, package_path=package, inductor_configs=PACKAGE_OPTIONS)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m aitune_core.aoti_compile_process PROGRAM PACKAGE\n")
        return 2
    compile_program(args[0], args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
