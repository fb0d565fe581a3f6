"""Builds native/ into the extension module llmd._native through cffi.

pip runs this (setup.py names it in cffi_modules): `pip install -e .` rebuilds
the engine. Environment switches:
  LLMD_PORTABLE=1   no -march=native: a build that runs on any x86-64 / arm64 CPU
  LLMD_MARCH=ARCH   -march=ARCH instead of -march=native, e.g. x86-64-v3 (AVX2, no
                    AVX-512) to build and test the AVX2 kernels on an AVX-512 machine
  LLMD_SANITIZE=1   AddressSanitizer + UndefinedBehaviorSanitizer, for tests
"""
import os
import pathlib

from cffi import FFI

ROOT = pathlib.Path(__file__).resolve().parent
NATIVE = ROOT / "native"


def cdef_source() -> str:
    """llmd.h without preprocessor lines and C++ guards, which cffi cannot parse."""
    lines, skipping = [], False
    for line in (NATIVE / "include" / "llmd.h").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#ifdef __cplusplus"):
            skipping = True
        elif skipping and stripped.startswith("#endif"):
            skipping = False
        elif not skipping and not stripped.startswith("#"):
            lines.append(line)
    return "\n".join(lines)


def compile_args() -> list[str]:
    # Python's own CFLAGS, which setuptools puts first, carry -fwrapv: signed overflow
    # defined to wrap. The engine never relies on that, and under it GCC keeps int index
    # arithmetic exact instead of strength-reducing it, which cost paged attention's
    # decode at 4,096 positions a tenth of its speed; -fno-wrapv also lets the sanitizer
    # build report a signed overflow.
    args = ["-std=c++17", "-Wall", "-Wextra", "-pthread", "-fno-wrapv"]
    if os.environ.get("LLMD_SANITIZE") == "1":
        return args + ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined"]
    args.append("-O3")
    if os.environ.get("LLMD_PORTABLE") != "1":
        args.append("-march=" + os.environ.get("LLMD_MARCH", "native"))
    return args


def link_args() -> list[str]:
    if os.environ.get("LLMD_SANITIZE") == "1":
        return ["-pthread", "-fsanitize=address,undefined"]
    return ["-pthread"]


ffibuilder = FFI()
ffibuilder.cdef(cdef_source())
ffibuilder.set_source(
    "llmd._native",
    '#include "llmd.h"',
    # setuptools wants paths relative to the project root, where pip runs us.
    # The engine's sources and one file per architecture (native/src/arch/).
    sources=sorted(str(p.relative_to(ROOT)) for p in (NATIVE / "src").glob("**/*.cpp")),
    include_dirs=["native/include", "native/src"],
    source_extension=".cpp",
    extra_compile_args=compile_args(),
    extra_link_args=link_args(),
    libraries=["stdc++"],
)
