"""Writes tests/data/quantize_golden.json from llama.cpp (run by hand, never by the tests).

    python3 -m tests.support.make_quantize_golden LLAMA_DIR     (a python3 with numpy, for gguf-py)

LLAMA_DIR is a llama.cpp source tree built in LLAMA_DIR/build. Two tables:
- "rows": for each row of golden_rows() and each type of TYPES, the bytes (hex) of
  ggml_quantize_chunk (the function llama-quantize runs on every tensor; without an
  importance matrix it takes each format's reference quantizer), called from
  LLAMA_DIR/build/bin/libggml-base.so through ctypes;
- "digests": for each type, the SHA-256 of what ggml_quantize_chunk makes of the
  matrix digest_matrix() (too big to keep as bytes, big enough that a quantizer
  rounding differently somewhere, e.g. through a fused multiply-add, changes it);
- "mixes": for each model of TINY_MODELS (F16, random weights) its tensors' names in
  llama-quantize's output order and, for each mix of MIXES, the types llama-quantize
  gave them, read back with llama.cpp's gguf-py (space-separated).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.gguf_writer import GGML_F16, build_tiny_llama
from tests.random_model import random_f16

# GGUF type numbers of the quantizers compared byte for byte.
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
ROW = 256  # one K-quant super-block, eight 32-element blocks
OUT = Path(__file__).parents[1] / "data" / "quantize_golden.json"
MIXES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K")

# Tiny F16 models whose shapes reach the mix rules: K-quant rows with an ffn_down of
# 288 columns (falls back to 32-element types) over 12 layers, untied; rows of 64
# (every K-quant falls back), tied; and 8 experts (the 8-expert rules), tied.
TINY_MODELS = {
    "llama-256-untied": dict(n_embd=256, n_layer=12, n_head=4, n_head_kv=2, n_ff=288, tied=False),
    "llama-64-tied": dict(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, tied=True),
    "qwen3moe-256": dict(arch="qwen3moe", n_embd=256, n_layer=3, n_head=4, n_head_kv=2, n_ff=256, tied=True),
}


def write_tiny_model(name: str, path: Path) -> Path:
    return build_tiny_llama(**TINY_MODELS[name], weight_type=GGML_F16, random_matrix=random_f16).write(path)


def golden_rows() -> list[list[float]]:
    """Rows of exactly representable floats (multiples of 2^-18 drawn from a seeded
    generator: no libm involved, so every machine makes the same rows), shaped to reach
    the quantizers' branches: spread values, an outlier, all-positive and all-negative
    groups (the K-quants' min clipping), a zero sub-block, and tiny values."""
    rng = random.Random(16)

    def draw(lo: int, hi: int) -> float:
        return rng.randint(lo, hi) / 2**18

    spread = [draw(-2**18, 2**18) for _ in range(ROW)]
    outlier = [draw(-2**14, 2**14) for _ in range(ROW)]
    outlier[37] = 9.5
    outlier[200] = -7.25
    signs = [draw(1, 2**17) if (i // 32) % 3 == 0 else draw(-2**17, -1) if (i // 32) % 3 == 1 else draw(-2**16, 2**16)
             for i in range(ROW)]
    sparse = [0.0 if 64 <= i < 96 else draw(-2**12, 2**12) for i in range(ROW)]
    tiny = [draw(-64, 64) for _ in range(ROW)]
    return [spread, outlier, signs, sparse, tiny]


DIGEST_ROWS, DIGEST_COLS = 256, 1024


def digest_matrix() -> bytes:
    """DIGEST_ROWS x DIGEST_COLS f32 values (little-endian bytes) with random signs,
    exponents for magnitudes in [2^-8, 2^3) and full 23-bit mantissas, built from
    random bits (no libm): every product the quantizers form rounds."""
    rng = random.Random(1616)
    words = [rng.getrandbits(1) << 31 | rng.randint(119, 129) << 23 | rng.getrandbits(23)
             for _ in range(DIGEST_ROWS * DIGEST_COLS)]
    return struct.pack(f"<{len(words)}I", *words)


def mix_types(llama: Path) -> dict[str, dict]:
    sys.path.append(str(llama / "gguf-py"))
    from gguf import GGUFReader
    tables: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in TINY_MODELS:
            src = write_tiny_model(model, Path(tmp) / f"{model}.gguf")
            tables[model] = {}
            for mix in MIXES:
                dst = Path(tmp) / f"{model}-{mix}.gguf"
                subprocess.run([str(llama / "build" / "bin" / "llama-quantize"), str(src), str(dst), mix],
                               check=True, capture_output=True)
                tensors = GGUFReader(dst).tensors
                tables[model]["tensors"] = " ".join(t.name for t in tensors)
                tables[model][mix] = " ".join(t.tensor_type.name for t in tensors)
    return tables


def row_bytes_table(llama: Path) -> dict[str, list[str]]:
    lib = ctypes.CDLL(str(llama / "build" / "bin" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    golden: dict[str, list[str]] = {}
    for name, ggml_type in TYPES.items():
        golden[name] = []
        for row in golden_rows():
            src = (ctypes.c_float * ROW)(*row)
            dst = ctypes.create_string_buffer(ROW * 2)
            size = lib.ggml_quantize_chunk(ggml_type, src, dst, 0, 1, ROW, None)
            golden[name].append(dst.raw[:size].hex())
    return golden


def digests(llama: Path) -> dict[str, str]:
    lib = ctypes.CDLL(str(llama / "build" / "bin" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    matrix = digest_matrix()
    out = {}
    for name, ggml_type in TYPES.items():
        dst = ctypes.create_string_buffer(len(matrix))
        size = lib.ggml_quantize_chunk(ggml_type, matrix, dst, 0, DIGEST_ROWS, DIGEST_COLS, None)
        out[name] = hashlib.sha256(dst.raw[:size]).hexdigest()
    return out


def main() -> None:
    llama = Path(sys.argv[1])
    golden = {"rows": row_bytes_table(llama), "digests": digests(llama), "mixes": mix_types(llama)}
    OUT.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
