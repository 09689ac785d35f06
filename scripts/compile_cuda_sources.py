"""Compile every CUDA C source of the audit with NVRTC, on a machine without a GPU.

A lent GPU's minutes are few, and a kernel that does not compile would cost one of its calls.
NVRTC, NVIDIA's runtime compiler (what CuPy compiles raw kernels with), needs no device: this
loads its library and compiles each source of :data:`SOURCES` for ``--arch`` (default
``compute_90``: an H100 or H200), printing one line per source and, for one that fails, the
compiler's log.

    python scripts/compile_cuda_sources.py [--library PATH] [--arch compute_90]

The library is ``--library``, else the first ``libnvrtc.so.*`` of an ``nvidia`` package on
``sys.path`` (NVIDIA's ``nvidia-cuda-nvrtc-cu12`` wheel, about 90 MB, which is not one of the
project's dependencies: install it in a scratch environment and put its site folder on
``PYTHONPATH``), else the system's. Exit status: 0 when every source compiles, 1 when one does
not, 2 when no NVRTC library is found. It checks that a source compiles, not what it computes:
the CPU tests run the same sources under the host's C++ compiler for that.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from oversmooth.importers.runtime.device_spectra import BISECTION_SOURCE
from oversmooth.importers.runtime.householder_kernels import BLOCK_SOURCE, STEP_SOURCE
from oversmooth.importers.runtime.panel_kernel import PANEL_SOURCE

#: Every CUDA C source the audit compiles at run time (CuPy's ``RawKernel``/``RawModule``), by
#: name. The fused kernels' snippets are CuPy's ``ElementwiseKernel``/``ReductionKernel`` bodies,
#: which CuPy wraps in its own source: not here.
SOURCES = {
    "bisection": BISECTION_SOURCE,
    "householder steps": STEP_SOURCE,
    "householder single launch": BLOCK_SOURCE,
    "householder panels": PANEL_SOURCE,
}


def find_library(given: str | None) -> Path | None:
    """The NVRTC library: ``given``, else an ``nvidia`` package's on ``sys.path``, else the
    system's; None where there is none."""
    if given:
        return Path(given)
    for entry in sys.path:
        folder = Path(entry) / "nvidia"
        if folder.is_dir():
            found = sorted(
                path for path in folder.glob("**/libnvrtc.so.*") if ".alt." not in path.name
            )
            if found:
                return found[0]
    system = ctypes.util.find_library("nvrtc")
    return Path(system) if system else None


def compile_source(library: ctypes.CDLL, name: str, source: str, arch: str) -> tuple[bool, str]:
    """Whether ``source`` compiles for ``arch``, and NVRTC's log."""
    program = ctypes.c_void_p()
    status = library.nvrtcCreateProgram(
        ctypes.byref(program), source.encode(), name.encode(), 0, None, None
    )
    if status != 0:
        return False, f"nvrtcCreateProgram returned {status}"
    options = [f"--gpu-architecture={arch}".encode()]
    status = library.nvrtcCompileProgram(
        program, len(options), (ctypes.c_char_p * len(options))(*options)
    )
    size = ctypes.c_size_t()
    library.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    library.nvrtcGetProgramLog(program, log)
    library.nvrtcDestroyProgram(ctypes.byref(program))
    return status == 0, log.value.decode(errors="replace").strip()


def _say(text: str, stream: TextIO | None = None) -> None:
    print(text, file=stream or sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", help="the NVRTC shared library (default: searched)")
    parser.add_argument("--arch", default="compute_90", help="NVRTC's --gpu-architecture")
    args = parser.parse_args(argv)
    path = find_library(args.library)
    if path is None or not path.is_file():
        where = path or "an nvidia package on sys.path or the system's libraries"
        _say(
            f"no NVRTC library found at {where}; expected libnvrtc.so "
            "(pip install nvidia-cuda-nvrtc-cu12 in a scratch environment, or --library PATH)",
            sys.stderr,
        )
        return 2
    library = ctypes.CDLL(str(path))
    failed = 0
    for name, source in SOURCES.items():
        compiled, log = compile_source(library, name, source, args.arch)
        _say(f"{name}: {'compiles' if compiled else 'does not compile'} for {args.arch}")
        if not compiled:
            failed += 1
            _say(log)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
