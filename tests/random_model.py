"""Random-weight llama GGUFs at real sizes, for benchmarks and reference checks.

    python -m tests.random_model OUT.gguf --shape llama-3.2-1b
    python -m tests.random_model OUT.gguf --shape k256

F16 weights drawn from random bytes (a billion of them take seconds, not the hours
Python's Gaussian would), the writer's byte-level BPE vocabulary padded with
reserved control tokens to the shape's size. Quantize the file with llama.cpp's
llama-quantize to get Q4_K_M, Q4_0, Q8_0, ... files of the same weights.

Shapes:
  llama-3.2-1b  n_embd 2048, 16 layers, 32 / 8 heads, ff 8192, vocab 128256, tied
  k256          n_embd 512, 4 layers, 8 / 4 heads, ff 1536, vocab 1024: every row a
                whole number of 256-element K-quant super-blocks, so llama-quantize
                has no reason to fall back to 32-element types for any matrix
"""
from __future__ import annotations

import argparse
import math
import random

from tests.gguf_writer import GGML_F16, build_tiny_llama

SHAPES = {
    "llama-3.2-1b": dict(n_vocab=128256, n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192,
                         n_ctx=4096, reserved=127000),
    "k256": dict(n_vocab=1024, n_embd=512, n_layer=4, n_head=8, n_head_kv=4, n_ff=1536, n_ctx=2048, reserved=256),
}


def random_f16(cols: int, rows: int, std: float, rng: random.Random) -> bytes:
    """cols x rows halves with random signs and mantissas whose exponents put |w| in
    [std / 8, 2 std): each value's high byte (sign, 5 exponent bits, 2 mantissa bits)
    gets one of three exponents around log2(std) from its own random bits."""
    top = 15 + math.floor(math.log2(std))
    exponents = [top - 2, top - 1, top, top]
    table = bytes((b & 0x83) | exponents[(b >> 2) & 3] << 2 for b in range(256))
    n, chunk = 2 * cols * rows, 1 << 26  # randbytes takes at most 2^31 bits at a time
    data = bytearray(b"".join(rng.randbytes(min(chunk, n - i)) for i in range(0, n, chunk)))
    data[1::2] = bytes(data[1::2]).translate(table)
    return bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    w = build_tiny_llama(**SHAPES[args.shape], weight_type=GGML_F16, seed=args.seed, name=f"random-{args.shape}",
                         random_matrix=random_f16)
    w.write(args.out)


if __name__ == "__main__":
    main()
