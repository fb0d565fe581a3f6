"""Builds native/tests/kernel_test.cpp with the engine's sources and the kernel
variants of an ISA, each variant's translation unit with its own flags
(build_native.VARIANT_FLAGS), by any C++ compiler: natively, or a cross compiler
whose binary an emulator runs (.ci/arm64).

  python native/tests/build_kernel_test.py --cxx aarch64-linux-gnu-g++ --isa arm \\
      --out build/kernel_test_arm -- -static
"""
import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import build_native  # noqa: E402


# No CPU of the machines the tests run on may have AVX-VNNI (nor does qemu emulate it), so
# the test also carries the avx-vnni variant's sources built with the EVEX form of the
# same instructions (AVX-512 VL and VNNI; kernels/x86/simd_avx2.h), under another name:
# kernel_test.cpp runs it against the references on CPUs with AVX-512 VNNI.
AVX_VNNI_TWIN = ("native/src/kernels/x86/avx_vnni.cpp", "avx_vnni_evex",
                 build_native.VARIANT_FLAGS["x86"]["avx2.cpp"]
                 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-Dkernels_avx_vnni=kernels_avx_vnni_evex"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cxx", default="g++")
    parser.add_argument("--isa", default=build_native.kernel_isa(), help="x86 or arm (default: this machine's)")
    parser.add_argument("--out", default="build/kernel_test")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("extra", nargs="*", help="more flags for every compile and the link (e.g. -static)")
    args = parser.parse_args()
    out = ROOT / args.out
    objects_dir = out.parent / (out.name + ".objects")
    objects_dir.mkdir(parents=True, exist_ok=True)
    # The engine's own flags (-O3: the kernels' small loops unroll, as they do in the engine).
    base = [args.cxx] + build_native.compile_args() + ["-Inative/include", "-Inative/src"] + args.extra
    # (source, object name, flags): the engine's units with their own flags, the test.
    units = [(source, source.replace("/", "_"), build_native.variant_flags(source) or [])
             for source in build_native.sources(args.isa) + ["native/tests/kernel_test.cpp"]]
    if args.isa == "x86":
        units.append(AVX_VNNI_TWIN)
    # An object newer than every header is rebuilt only when its own source changed.
    headers = max(p.stat().st_mtime for p in (ROOT / "native").glob("**/*.h"))

    def compile_unit(unit: tuple[str, str, list[str]]) -> str:
        source, name, flags = unit
        obj = objects_dir / (name + ".o")
        if obj.exists() and obj.stat().st_mtime > max(headers, (ROOT / source).stat().st_mtime):
            return str(obj)
        subprocess.run(base + flags + ["-c", source, "-o", str(obj)], cwd=ROOT, check=True)
        return str(obj)

    try:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            objects = list(pool.map(compile_unit, units))
    except subprocess.CalledProcessError as e:
        print("build_kernel_test: failed:", " ".join(e.cmd), file=sys.stderr)
        return 1
    subprocess.run(base + objects + ["-o", str(out)], cwd=ROOT, check=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
