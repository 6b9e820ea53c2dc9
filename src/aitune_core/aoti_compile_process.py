"""The child process that compiles an exported program into an AOTInductor package:
`python -m aitune_core.aoti_compile_process PROGRAM PACKAGE`.

Why a process: the compile is seconds to minutes of Python (Inductor's lowering and code generation) and a C++
build. In the serving process it would take turns with the requests for the GIL; in a process of its own it runs
beside them. `aitune_core.aoti_packaging.compile_package` writes PROGRAM (`torch.export.save`) and starts this.
Weights stay out of the package (`aot_inductor.package_constants_in_so=False`): the loading process binds its own
module's tensors (`backends/aoti_package.py`).

The child then loads the package it made, binds the program's own weights and runs it on the program's example
inputs against the program itself (`verify_package`): a package that crashes its loader (on an H100 with torch
2.11, loading any AOTInductor package killed the process with SIGSEGV) or computes something else fails here,
in a process of its own, never in the serving process that would load it.
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


def verify_package(program: str, package: str) -> None:
    """Load `package`, bind the weights of the program it was made from, and compare their outputs on the program's
    example inputs (raises `AssertionError` on a difference)."""
    import torch

    exported = torch.export.load(program)
    runner = torch._inductor.aoti_load_package(package)
    tensors = {**exported.state_dict, **exported.constants}
    runner.load_constants({name: tensors[name] for name in runner.get_constant_fqns()}, check_full_update=True,
                          user_managed=True)
    if exported.example_inputs is None:
        return
    args, kwargs = exported.example_inputs
    with torch.no_grad():
        got, want = runner(*args, **kwargs), exported.module()(*args, **kwargs)
    got_leaves, want_leaves = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves), f"{len(got_leaves)} outputs, the program has {len(want_leaves)}"
    for index, (a, b) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3, msg=lambda m, i=index: f"output {i}: {m}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m aitune_core.aoti_compile_process PROGRAM PACKAGE\n")
        return 2
    compile_program(args[0], args[1])
    print("compiled; verifying the package in this process", flush=True)
    verify_package(args[0], args[1])
    print("verified", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
