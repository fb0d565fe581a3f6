"""Builds native/ into the extension module llmd._native through cffi.

pip runs this (setup.py names it in cffi_modules): `pip install -e .` rebuilds
the engine. The build is portable: the engine is compiled for its ISA's baseline, and
each kernel variant (native/src/kernels/, one table per variant, chosen at run time
from what the CPU reports) in translation units of its own, with its own flags
(VARIANT_FLAGS; setup.py's build_ext applies them). Environment switches:
  LLMD_MARCH=ARCH   also compile the baseline code with -march=ARCH (e.g. native);
                    the variants keep their own flags
  LLMD_SANITIZE=1   AddressSanitizer + UndefinedBehaviorSanitizer, for tests
"""
import os
import pathlib
import platform

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
    if os.environ.get("LLMD_MARCH"):
        args.append("-march=" + os.environ["LLMD_MARCH"])
    return args


# The kernel variants of each ISA: their folder under native/src/kernels/ and each
# translation unit's flags (every file of the folder that is not listed is a header).
_X86_256 = ["-mavx2", "-mfma", "-mf16c", "-mbmi2"]
VARIANT_FLAGS = {
    "x86": {
        "avx2.cpp": _X86_256,
        "avx_vnni.cpp": _X86_256 + ["-mavxvnni"],
        # GCC 12's own AVX-512 reductions trip its uninitialised-value warnings (fixed in 13).
        "avx512.cpp": _X86_256 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni",
                                  "-Wno-uninitialized", "-Wno-maybe-uninitialized"],
    },
    # arm64: neon is the armv8-a baseline every arm64 CPU has (the engine's own flags).
    "arm": {
        "neon.cpp": [],
        "dotprod.cpp": ["-march=armv8.2-a+dotprod"],
        "i8mm.cpp": ["-march=armv8.2-a+dotprod+i8mm"],
    },
}


def kernel_isa() -> str | None:
    """The folder of native/src/kernels/ whose variants this machine's build carries."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x86"
    return "arm" if machine in ("aarch64", "arm64") else None


def variant_flags(source: str) -> list[str] | None:
    """The flags of a kernel variant's translation unit, or None for any other source."""
    path = pathlib.PurePath(source)
    if not path.parent.parent.as_posix().endswith("native/src/kernels"):
        return None
    flags = VARIANT_FLAGS[path.parent.name][path.name]
    if os.environ.get("LLMD_SANITIZE") == "1":
        # GCC 12 under its null-pointer checks cannot compare a constant table's address
        # with nullptr at compile time, as the kernels' layouts do (PanelLayout::lut).
        flags = flags + ["-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute"]
    return flags


def sources(isa: str | None = None) -> list[str]:
    """Every translation unit of the engine, the variants of `isa` (by default this
    machine's) included."""
    isa = isa or kernel_isa()
    found = []
    for p in sorted((NATIVE / "src").glob("**/*.cpp")):
        rel = p.relative_to(ROOT)
        if rel.parent.parent == pathlib.Path("native/src/kernels") and rel.parent.name != isa:
            continue
        found.append(str(rel))
    return found


def headers() -> list[str]:
    """Every header of the engine: a change to one rebuilds it (setuptools relinks only
    when a source or one of these is newer than the module)."""
    return [str(p.relative_to(ROOT)) for p in sorted(NATIVE.glob("**/*.h"))]


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
    sources=sources(),
    depends=headers(),
    include_dirs=["native/include", "native/src"],
    source_extension=".cpp",
    extra_compile_args=compile_args(),
    extra_link_args=link_args(),
    libraries=["stdc++"],
)
