"""Kernels: every kernel variant this CPU runs (native/src/kernels/: the scalar one, and
avx2, avx-vnni, avx512 or neon, dotprod, i8mm as the CPU has them), its repacked panels
and its row dot products, against each type's scalar reference, and the reference against a
pure-Python model, through llmd.engine.native.kernel_matmul; the reference dequantization
against the Python decoders through kernel_dequantize; attention and GLU likewise.

The Python model (tests/support/gguf_writer.py: `pieces`, `dequantize`) decodes every block
format from its definition, independently of the engine's C++. For integer types
the engine first quantizes x to int8 (d = amax / 127 in float32 per block of 32,
or per 256 for the K-quants as llama.cpp's Q8_K does; q = round-to-nearest-even of
x / d); the model does exactly that, dequantizes the
weights and takes the dot product in double precision.

Tolerances, relative to S = sum |w_i * x_i| + sum |min_i * x_i| over the row (the
size of the rounding any summation order can cause; the second sum counts the
terms of types with additive mins, which the kernels form separately):
  fast vs reference: (4 * pieces + 16) * 2^-24 * S. Both share the quantized x;
    the fast paths round in float32 at most four times a 32-element piece (scale
    times x.d, the product, two min terms) and once per final sum.
  Plus 2^-120 absolute for both: a tiny scale times a tiny x.d is a float32
    subnormal, with fewer significant bits (MXFP4 scales go down to 2^-128).
  reference vs model: 3e-7 * S. The reference sums in double and rounds once to
    float (2^-24 of |y| <= S); the rest is margin.
  dequantization: 2^-23 * (|d * scale * q| + |min|) per element: the reference
    rounds the product and the sum in float32 (exact for F32, F16, BF16).
"""
from __future__ import annotations

import math
import os
import random
import struct
import subprocess
import sys

import pytest

from llmd.engine.native import (
    EngineError, kernel_attention, kernel_dequantize, kernel_glu, kernel_matmul, kernel_quantize, kernel_rmsnorm,
    kernel_kv_row, kernel_variants, tensor_type,
)
from tests.support.gguf_writer import (
    GGML_BF16, GGML_F16, GGML_F32, GGML_IQ2_XXS, GGML_IQ4_NL, GGML_IQ4_XS, GGML_MXFP4, GGML_Q2_K, GGML_Q3_K,
    GGML_Q4_0, GGML_Q4_1, GGML_Q4_K, GGML_Q5_0, GGML_Q5_1, GGML_Q5_K, GGML_Q6_K, GGML_Q8_0, QK, TYPE_LAYOUT,
    TYPE_NAMES, dequantize, encode_f16, f16_bits, f16_value, f32, pack_q4_0, pack_q4_1, pack_q8_0, pieces,
    quantize_q4_0, quantize_q4_1, quantize_q8_0, random_blocks, row_bytes,
)

MODEL_TOL = 3e-7

# The variants this CPU runs, and each one's matrix paths: over its repacked panels
# (where it has a panel kernel for the type), and its row kernels.
VARIANTS = [v.name for v in kernel_variants() if v.runs]
PATHS = [(name, packed) for name in VARIANTS for packed in (True, False)]
PATH_IDS = [f"{name}-{'packed' if packed else 'rows'}" for name, packed in PATHS]

FLOATS = [GGML_F32, GGML_F16, GGML_BF16]
QUANTIZED = [GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_Q8_0, GGML_IQ4_NL, GGML_MXFP4,
             GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_IQ4_XS]
TYPES = FLOATS + QUANTIZED
K_TYPES = (GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_IQ4_XS)
NAMES = [TYPE_NAMES[t] for t in TYPES]
Q_NAMES = [TYPE_NAMES[t] for t in QUANTIZED]

F16_MAX, F16_MIN_SUBNORMAL = 0x7BFF, 0x0001  # 65504 and 2^-24

# Byte offsets of each type's f16 scale fields (d, and dmin or m) in a block.
SCALE_FIELDS = {GGML_Q4_0: [0], GGML_Q4_1: [0, 2], GGML_Q5_0: [0], GGML_Q5_1: [0, 2], GGML_Q8_0: [0],
                GGML_IQ4_NL: [0], GGML_Q2_K: [80, 82], GGML_Q3_K: [108], GGML_Q4_K: [0, 2], GGML_Q5_K: [0, 2],
                GGML_Q6_K: [208], GGML_IQ4_XS: [0]}


# ---- inputs ------------------------------------------------------------------------------

def random_f16_bits(rng: random.Random) -> int:
    """Any finite half: zeros, subnormals, normals up to ±65504."""
    while True:
        h = rng.randrange(1 << 16)
        if (h >> 10) & 0x1F != 0x1F:
            return h


def random_block(ggml_type: int, rng: random.Random) -> bytes:
    """One block of a quantized type, biased towards the edge cases: all bit
    patterns of the quants and sub-scales, with extreme, tiny or zero scales."""
    kind = rng.choice(["encoded", "encoded", "raw", "zero", "zero_scale", "max_scale", "tiny_scale"])
    size = TYPE_LAYOUT[ggml_type][1]
    if kind == "zero":
        return bytes(size)
    if kind == "encoded":
        scale = rng.choice([1e-3, 1.0, 50.0])
        encode = {GGML_Q4_0: quantize_q4_0, GGML_Q4_1: quantize_q4_1, GGML_Q8_0: quantize_q8_0}.get(ggml_type)
        if encode is None:
            return random_blocks(ggml_type, TYPE_LAYOUT[ggml_type][0], rng, scale)
        return encode([rng.gauss(0.0, scale) for _ in range(QK)])
    block = bytearray(rng.randbytes(size))
    if ggml_type == GGML_MXFP4:  # the e8m0 exponent: 2^-128 .. 2^52 keeps every sum finite
        block[0] = {"raw": rng.randrange(181), "zero_scale": 0, "max_scale": 180, "tiny_scale": 1}[kind]
        return bytes(block)
    for at in SCALE_FIELDS[ggml_type]:
        d = {"raw": random_f16_bits(rng), "zero_scale": 0, "max_scale": rng.choice([F16_MAX, F16_MAX | 0x8000]),
             "tiny_scale": rng.choice([F16_MIN_SUBNORMAL, 0x03FF, 0x8001])}[kind]
        struct.pack_into("<H", block, at, d)
    return bytes(block)


def random_weights(ggml_type: int, rows: int, cols: int, rng: random.Random) -> bytes:
    if ggml_type == GGML_F32:
        return struct.pack(f"<{rows * cols}f", *(rng.gauss(0.0, 1.0) * rng.choice([1e-30, 1e-3, 1.0, 1e3, 1e12])
                                                if rng.random() > 0.05 else 0.0 for _ in range(rows * cols)))
    if ggml_type == GGML_F16:
        return struct.pack(f"<{rows * cols}H", *(random_f16_bits(rng) for _ in range(rows * cols)))
    if ggml_type == GGML_BF16:  # finite bf16: exponent below all-ones
        bits = []
        while len(bits) < rows * cols:
            h = rng.randrange(1 << 16)
            if (h >> 7) & 0xFF != 0xFF and (h >> 7) & 0xFF < 0xC0:  # |w| < 2^65 keeps sums finite
                bits.append(h)
        return struct.pack(f"<{rows * cols}H", *bits)
    elems = TYPE_LAYOUT[ggml_type][0]
    return b"".join(random_block(ggml_type, rng) for _ in range(rows * cols // elems))


def random_x(cols: int, rng: random.Random) -> list[float]:
    """float32 values, in blocks of 32 of varied character."""
    x: list[float] = []
    while len(x) < cols:
        kind = rng.choice(["gauss", "gauss", "zeros", "tiny", "large", "spike", "halves"])
        if kind == "zeros":
            block = [0.0] * QK
        elif kind == "spike":
            block = [0.001] * QK
            block[rng.randrange(QK)] = -100.0
        elif kind == "halves":  # x / d lands exactly on .5: checks round-half-to-even
            block = [127.0] + [k + 0.5 for k in range(-15, 16)]
            rng.shuffle(block)
        else:
            scale = {"gauss": 1.0, "tiny": 1e-20, "large": 1e4}[kind]
            block = [rng.gauss(0.0, scale) for _ in range(QK)]
        x += block
    return [f32(v) for v in x[:cols]]


# ---- the Python model --------------------------------------------------------------------

def quantize_x(x: list[float], group: int = QK) -> list[float]:
    """x as the engine's int8 activation blocks see it: d * q, d and q as C computes
    them, one d per group of elements (32, or 256 for the K-quants, as llama.cpp's Q8_K)."""
    out = []
    for b in range(0, len(x), group):
        block = x[b:b + group]
        d = f32(max(abs(v) for v in block) / 127.0)
        inv = f32(1.0 / d) if d != 0.0 else 0.0
        out += [d * round(f32(v * inv)) for v in block]  # round(): nearest, ties to even
    return out


def kernel_matvec(ggml_type: int, weights: bytes, rows: int, cols: int, x: list[float], kernels: str | None,
                  packed: bool = True) -> list[float]:
    return kernel_matmul(ggml_type, weights, rows, cols, [x], kernels, packed)[0]


def row_mins(ggml_type: int, row: bytes, cols: int) -> list[float]:
    """Each element's additive min (0 for types without)."""
    if ggml_type in FLOATS:
        return [0.0] * cols
    return [minimum[i // 16] for _, _, minimum, _ in pieces(ggml_type, row, cols) for i in range(QK)]


class Matrix:
    """A weight matrix decoded once by the Python model."""

    def __init__(self, ggml_type: int, weights: bytes, rows: int, cols: int):
        stride = row_bytes(ggml_type, cols)
        self.type = ggml_type
        self.rows = [dequantize(ggml_type, weights[r * stride:(r + 1) * stride], cols) for r in range(rows)]
        self.mins = [row_mins(ggml_type, weights[r * stride:(r + 1) * stride], cols) for r in range(rows)]

    def apply(self, x: list[float]) -> tuple[list[float], list[float]]:
        """(y, S per row) for x as the kernels see it."""
        xs = quantize_x(x, 256 if self.type in K_TYPES else QK) if self.type in QUANTIZED else x
        y = [math.fsum(w * v for w, v in zip(row, xs)) for row in self.rows]
        scale = [math.fsum(abs(w * v) for w, v in zip(row, xs)) + math.fsum(abs(m * v) for m, v in zip(mins, xs))
                 for row, mins in zip(self.rows, self.mins)]
        return y, scale


UNDERFLOW = 2.0 ** -120


def worst(a: list[float], b: list[float], scale: list[float]) -> tuple[float, float]:
    """(max |a - b|, max of (|a - b| - 2^-120) / S)."""
    diffs = [abs(p - q) for p, q in zip(a, b)]
    return max(diffs), max(max(0.0, d - UNDERFLOW) / s if s else (math.inf if d else 0.0)
                           for d, s in zip(diffs, scale))


def shapes(ggml_type: int) -> list[tuple[int, int]]:
    if ggml_type in FLOATS:
        return [(16, 256), (3, 37), (2, 8), (1, 1)]
    if ggml_type in K_TYPES:
        return [(16, 256), (3, 512), (2, 1024), (37, 256)]
    return [(16, 256), (4, 32), (2, 1024), (37, 64)]


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES)
def test_fast_kernels_match_reference_and_reference_matches_python_model(ggml_type):
    rng = random.Random(1000 + ggml_type)
    worst_fast = {path: (0.0, 0.0) for path in PATHS}
    worst_model = (0.0, 0.0)
    for rows, cols in shapes(ggml_type):
        fast_tol = (4 * max(1, cols // QK) + 16) * 2.0 ** -24
        # Every token tile of the packed kernels (panel_tile_tokens): 7 = 4 + 2 + 1 (or 6 + 1),
        # 17 = 8 + 8 + 1, 10 + 4 + 2 + 1 or 6 + 6 + 4 + 1.
        for n_tokens in (1, 7, 17):
            weights = random_weights(ggml_type, rows, cols, rng)
            matrix = Matrix(ggml_type, weights, rows, cols)
            xs = [random_x(cols, rng) for _ in range(n_tokens)]
            refs = kernel_matmul(ggml_type, weights, rows, cols, xs, None)
            for path in PATHS:
                fasts = kernel_matmul(ggml_type, weights, rows, cols, xs, *path)
                for x, fast, ref in zip(xs, fasts, refs):
                    _, scale = matrix.apply(x)
                    assert all(math.isfinite(v) for v in fast), fast
                    wf = worst(fast, ref, scale)
                    worst_fast[path] = max(worst_fast[path], wf, key=lambda t: t[1])
                    assert wf[1] <= fast_tol, (path, rows, cols, fast, ref)
            for x, ref in zip(xs, refs):
                model, scale = matrix.apply(x)
                assert all(math.isfinite(v) for v in ref)
                wm = worst(ref, model, scale)
                worst_model = max(worst_model, wm, key=lambda t: t[1])
                assert wm[1] <= MODEL_TOL, (rows, cols, ref, model)
    for path, (diff, of_s) in worst_fast.items():
        print(f"{TYPE_NAMES[ggml_type]} {path}: vs ref max diff {diff:.3g} ({of_s:.3g} of S)")
    print(f"{TYPE_NAMES[ggml_type]}: ref vs model {worst_model[0]:.3g} ({worst_model[1]:.3g} of S)")


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES)
def test_fast_kernels_are_batch_invariant(ggml_type):
    """A token's result is bit-identical alone, in a batch of any size at any place."""
    rng = random.Random(77 + ggml_type)
    rows, cols = 37, 512  # two full panels, which Q4_0, Q4_1 and Q4_K tile as a pair, and a partial one
    weights = random_weights(ggml_type, rows, cols, rng)
    xs = [random_x(cols, rng) for _ in range(23)]  # tiles of 4 or 5 (pairs), 6, 8 and 10 tokens, then the rest
    for path in PATHS:
        alone = [kernel_matvec(ggml_type, weights, rows, cols, x, *path) for x in xs]
        assert kernel_matmul(ggml_type, weights, rows, cols, xs, *path) == alone, path
        assert kernel_matmul(ggml_type, weights, rows, cols, xs[3:8], *path) == alone[3:8], path
        assert kernel_matmul(ggml_type, weights, rows, cols, xs[1:12], *path) == alone[1:12], path


@pytest.mark.parametrize("ggml_type", QUANTIZED, ids=Q_NAMES)
def test_reference_dequantization_matches_python_decoder(ggml_type):
    rng = random.Random(500 + ggml_type)
    elems = TYPE_LAYOUT[ggml_type][0]
    n = max(elems, QK) * 8
    data = b"".join(random_block(ggml_type, rng) for _ in range(n // elems))
    got = kernel_dequantize(ggml_type, data, n)
    parts = pieces(ggml_type, data, n)
    for i, (value, expected) in enumerate(zip(got, dequantize(ggml_type, data, n))):
        d, scale, minimum, q = parts[i // QK]
        size = abs(d * scale[i % QK // 16] * q[i % QK]) + abs(minimum[i % QK // 16])
        assert abs(value - expected) <= 2.0 ** -23 * size, (i, value, expected)


@pytest.mark.parametrize("ggml_type", FLOATS, ids=[TYPE_NAMES[t] for t in FLOATS])
def test_float_dequantization_is_exact(ggml_type):
    rng = random.Random(ggml_type)
    data = random_weights(ggml_type, 1, 64, rng)
    assert kernel_dequantize(ggml_type, data, 64) == dequantize(ggml_type, data, 64)


def test_type_table_names_sizes_and_kernels():
    for ggml_type in TYPES:
        t = tensor_type(ggml_type)
        assert (t.name, (t.block_elems, t.block_bytes), t.runs) == (
            TYPE_NAMES[ggml_type], TYPE_LAYOUT[ggml_type], True)
    iq2 = tensor_type(GGML_IQ2_XXS)
    assert (iq2.name, iq2.block_elems, iq2.block_bytes, iq2.runs) == ("IQ2_XXS", 256, 66, False)
    assert tensor_type(4) is None and tensor_type(99) is None and tensor_type(-1) is None


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES)
def test_all_zero_weights_give_zero(ggml_type):
    cols = max(64, TYPE_LAYOUT[ggml_type][0])
    weights = bytes(row_bytes(ggml_type, cols) * 2)
    x = random_x(cols, random.Random(1))
    for path in [(None, False)] + PATHS:
        assert kernel_matvec(ggml_type, weights, 2, cols, x, *path) == [0.0, 0.0], path


@pytest.mark.parametrize("ggml_type", QUANTIZED, ids=Q_NAMES)
def test_block_layout_matches_the_writer(ggml_type):
    """A one-hot x reads back one weight: the writer's element k is the engine's."""
    rng = random.Random(ggml_type)
    elems = TYPE_LAYOUT[ggml_type][0]
    block = random_blocks(ggml_type, elems, rng)
    expected = dequantize(ggml_type, block, elems)
    assert any(expected)
    for k in range(elems):
        x = [0.0] * elems
        x[k] = 127 / 128  # quantizes exactly: q = 127, d = 1/128 (exact in f16 too)
        for path in [(None, False)] + PATHS:
            [y] = kernel_matvec(ggml_type, block, 1, elems, x, *path)
            assert y == pytest.approx(expected[k] * 127 / 128, rel=1e-6, abs=1e-30), (k, path)


def test_f16_kernel_reads_halves_as_the_writer_writes_them():
    values = [0.0, 1.0, -2.5, 65504.0, 2.0 ** -24, -(2.0 ** -14), 0.333251953125, 1000.5]
    weights = encode_f16(values)
    for k, v in enumerate(values):
        x = [0.0] * len(values)
        x[k] = 1.0
        for path in [(None, False)] + PATHS:
            assert kernel_matvec(GGML_F16, weights, 1, len(values), x, *path) == [v], path


def test_writer_quantizers_round_trip_within_half_a_step():
    rng = random.Random(5)
    values = [rng.gauss(0.0, 2.0) for _ in range(4 * QK)]
    for ggml_type, encode, steps in ((GGML_Q8_0, quantize_q8_0, 127), (GGML_Q4_0, quantize_q4_0, 8),
                                     (GGML_Q4_1, quantize_q4_1, 15)):
        back = dequantize(ggml_type, encode(values), len(values))
        for b in range(0, len(values), QK):
            block = values[b:b + QK]
            span = max(abs(v) for v in block) if ggml_type != GGML_Q4_1 else max(block) - min(block)
            step = span / steps
            # Half a step of rounding (a whole step for Q4_0, whose scale maps the
            # signed maximum to -8, so the opposite extreme clamps at +7), plus
            # the f16 rounding of the scale (and offset).
            rounding = step if ggml_type == GGML_Q4_0 else step / 2
            bound = rounding + 16 * span * 2.0 ** -11 + 1e-6
            assert all(abs(p - q) <= bound for p, q in zip(block, back[b:b + QK])), TYPE_NAMES[ggml_type]
    assert f16_bits(65504.0) == F16_MAX and f16_bits(1e6) == 0x7C00


def test_python_decoders_read_hand_built_blocks():
    """The test's own decoders, on blocks whose values are known by construction."""
    assert dequantize(GGML_Q4_0, pack_q4_0(f16_bits(0.5), list(range(16)) * 2), QK)[:3] == [-4.0, -3.5, -3.0]
    assert dequantize(GGML_Q4_1, pack_q4_1(f16_bits(2.0), f16_bits(-1.0), [3] * 32), QK) == [5.0] * 32
    assert dequantize(GGML_Q8_0, pack_q8_0(f16_bits(0.25), [-128] + [0] * 31), QK)[0] == -32.0
    # Q5_0: nibble 15 plus the fifth bit gives 31 - 16 = 15 for element 0, nibble 0 with no bit -16 for 1.
    q5 = struct.pack("<HI", f16_bits(1.0), 1) + bytes([0x0F, 0x00] + [0] * 14)
    assert dequantize(GGML_Q5_0, q5, QK)[:2] == [15.0, -16.0]
    # MXFP4: exponent 127 is a scale of 1; code 7 is 6.0, code 9 is -0.5.
    assert dequantize(GGML_MXFP4, bytes([127, 0x97] + [0] * 15), QK)[0:17:16] == [6.0, -0.5]
    # Q4_K: scale 1 and min 0 for sub-block 0, d = 1: element l = its low nibble.
    q4k = struct.pack("<HH", f16_bits(1.0), f16_bits(1.0)) + bytes([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    q4k += bytes(range(16)) * 8
    assert dequantize(GGML_Q4_K, q4k, 256)[:16] == [float(v) for v in range(16)]
    # Q6_K: all-zero quants are -32 times d times each scale.
    q6k = bytes(192) + struct.pack("<16b", *range(1, 17)) + struct.pack("<H", f16_bits(0.5))
    assert dequantize(GGML_Q6_K, q6k, 256)[::16] == [-16.0 * s for s in range(1, 17)]


@pytest.mark.parametrize("ggml_type, rows, cols, match", [
    (GGML_Q8_0, 2, 48, "bad matrix arguments"),
    (GGML_Q4_0, 2, 16, "bad matrix arguments"),
    (GGML_Q4_1, 2, 33, "bad matrix arguments"),
    (GGML_Q4_K, 2, 128, "bad matrix arguments"),
    (GGML_F32, 0, 32, "bad matrix arguments"),
    (GGML_Q8_0, 0, 32, "bad matrix arguments"),
    (GGML_F16, 2, 0, "bad matrix arguments"),
    (99, 2, 32, "unsupported tensor type 99"),
    (GGML_IQ2_XXS, 2, 256, "unsupported tensor type IQ2_XXS"),
    (4, 2, 32, "unsupported tensor type 4"),
    (-1, 2, 32, "unsupported tensor type -1"),
])
def test_bad_kernel_arguments_raise(ggml_type, rows, cols, match):
    weights = bytes(4096)  # large enough that a missed check could not read past it
    with pytest.raises(EngineError, match=match):
        kernel_matvec(ggml_type, weights, rows, cols, [1.0] * max(cols, 1), VARIANTS[-1])


# ---- attention ----------------------------------------------------------------------------

def softmax_attention(q: list[float], keys: list[list[float]], values: list[list[float]],
                      sink: float | None = None, softcap: float = 0.0) -> list[float]:
    """One query head's causal-attention output, in double precision; a sink logit, if
    given, joins the softmax's denominator (gpt-oss); a soft cap c > 0 makes each score
    s c·tanh(s / c) (Gemma 2)."""
    scores = [math.fsum(a * b for a, b in zip(q, k)) / math.sqrt(len(q)) for k in keys]
    if softcap > 0:
        scores = [softcap * math.tanh(sc / softcap) for sc in scores]
    top = max(scores + ([sink] if sink is not None else []))
    weights = [math.exp(sc - top) for sc in scores]
    total = math.fsum(weights + ([math.exp(sink - top)] if sink is not None else []))
    return [math.fsum(w * v[d] for w, v in zip(weights, values)) / total for d in range(len(q))]


# KV cache types: keys and values alike, and mixed (llama.cpp's -ctk / -ctv).
KV_PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("f16", "q4_0")]
KV_GGML = {"f16": GGML_F16, "q8_0": GGML_Q8_0, "q4_0": GGML_Q4_0}


def stored(kv_type: str, rows: list[list[float]]) -> list[list[float]]:
    """Each row as the KV cache holds it: written by the reference, decoded by its
    GGUF type's definition."""
    return [dequantize(KV_GGML[kv_type], kernel_kv_row(kv_type, row, None), len(row)) for row in rows]


def met_by(kv_type: str, q: list[float]) -> list[float]:
    """A query head as keys of kv_type meet it: quantized keys meet it quantized per 32
    dimensions as the activations are (quantize_q8a: d = amax / 127 and the nearest
    integers, ties to even, in float32), f16 keys as it is."""
    if kv_type == "f16":
        return q
    out = []
    for b in range(0, len(q), QK):
        d = f32(max(abs(x) for x in q[b:b + QK]) / 127.0)
        inv = f32(1.0 / d) if d else 0.0
        out += [d * round(f32(x * inv)) for x in q[b:b + QK]]
    return out


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_keys_meet_the_query_quantized(kv_type):
    """The query's quantization is the Python model's own, not the kernels': a query
    whose dimensions sit between Q8A steps scores as the quantized query does, not as
    the floats would."""
    q = [f32(1.0 + i / 1000.0) if i % 2 else f32(-0.3 - i / 700.0) for i in range(64)]
    # Keys exact in both types: Q8_0 d = 1 / 128, Q4_0 d = 1 / 8 (-8 × d, 7 × d)
    k = ([127 / 128 if i % 3 else -127 / 128 for i in range(64)] if kv_type == "q8_0"
         else [-1.0 if i % 3 else 7 / 8 for i in range(64)])
    v = [float(i) for i in range(64)] + [0.0] * 64
    quantized = met_by(kv_type, q)
    assert quantized != q
    scores = [math.fsum(a * b for a, b in zip(x, k)) / 8.0 for x in (quantized, q)]
    # Two positions whose keys are k and 0: the output weighs v by the softmax of [s, 0].
    for kernels in [None] + VARIANTS:
        got = kernel_attention([q], k + [0.0] * 64, v, 2, 64, 1, kernels, 0, kv_type, "f16")[0]
        w = 1.0 / (1.0 + math.exp(-scores[0]))
        assert abs(got[10] - 10.0 * w) < 1e-5, kernels
        assert abs(got[10] - 10.0 / (1.0 + math.exp(-scores[1]))) > 1e-4  # the floats would differ


@pytest.mark.parametrize("kv", KV_PAIRS, ids=["/".join(p) for p in KV_PAIRS])
@pytest.mark.parametrize("n_pos, head_dim, spread, group", [
    (1, 64, 1.0, 3), (63, 64, 1.0, 3), (65, 64, 1.0, 3), (300, 64, 8.0, 3), (130, 32, 1.0, 3), (40, 40, 1.0, 3),
    (70, 64, 1.0, 1), (70, 64, 4.0, 8), (70, 64, 1.0, 5), (70, 32, 1.0, 16), (70, 128, 1.0, 2)])
def test_fast_attention_matches_reference_and_the_python_model(n_pos, head_dim, spread, group, kv):
    """spread scales the scores: 8 makes softmax nearly one-hot, where a wrong running
    max or rescaling shows at once. head_dim 40 takes the reference path (f16 only:
    quantized rows hold blocks of 32). group is the number of query heads sharing the
    keys: the fast kernel is compiled for common sizes (1, 3, 8) and runs any other (5,
    16) through its general form. The Python model attends over the keys and values as
    the cache stores them: f16, or the GGUF blocks the reference quantizer writes, with
    the query as the keys meet it (met_by)."""
    if head_dim % 32 and kv != ("f16", "f16"):
        pytest.skip("quantized KV types need a head dimension that is a multiple of 32")
    rng = random.Random(n_pos * 1000 + head_dim + group)
    k = [f32(rng.gauss(0, 1)) for _ in range(n_pos * head_dim)]
    v = [f32(rng.gauss(0, 1)) for _ in range(n_pos * head_dim)]
    q = [[f32(rng.gauss(0, spread)) for _ in range(head_dim)] for _ in range(group)]
    keys = stored(kv[0], [k[p * head_dim:(p + 1) * head_dim] for p in range(n_pos)])
    values = stored(kv[1], [v[p * head_dim:(p + 1) * head_dim] for p in range(n_pos)])
    expected = [softmax_attention(met_by(kv[0], h), keys, values) for h in q]
    for ranges in sorted({1, min(3, n_pos)}):
        for run in (0, 16, 64):  # one buffer, or runs in buffers of their own as a paged cache's blocks
            for kernels in [None] + VARIANTS:
                got = kernel_attention(q, k, v, n_pos, head_dim, ranges, kernels, run, *kv)
                diff = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
                assert diff < 2e-5, (ranges, run, kernels, diff)


@pytest.mark.parametrize("kv", [("f16", "f16"), ("q8_0", "q4_0")], ids=["f16/f16", "q8_0/q4_0"])
@pytest.mark.parametrize("n_pos, group", [(1, 3), (70, 3), (200, 8)])
def test_attention_sinks_join_the_softmax_denominator_in_every_variant(n_pos, group, kv):
    """gpt-oss's sink logits, one per query head, folded after the ranges: the
    reference and every variant against the Python model, for sinks far below the
    scores (no effect), among them (a share) and far above (outputs near zero)."""
    rng = random.Random(n_pos * 10 + group)
    head_dim = 64
    k = [f32(rng.gauss(0, 1)) for _ in range(n_pos * head_dim)]
    v = [f32(rng.gauss(0, 1)) for _ in range(n_pos * head_dim)]
    q = [[f32(rng.gauss(0, 2)) for _ in range(head_dim)] for _ in range(group)]
    sinks = [(-20.0, f32(rng.gauss(0, 3)), 30.0)[g % 3] for g in range(group)]
    keys = stored(kv[0], [k[p * head_dim:(p + 1) * head_dim] for p in range(n_pos)])
    values = stored(kv[1], [v[p * head_dim:(p + 1) * head_dim] for p in range(n_pos)])
    expected = [softmax_attention(met_by(kv[0], h), keys, values, s) for h, s in zip(q, sinks)]
    plain = [softmax_attention(met_by(kv[0], h), keys, values) for h in q]
    assert max(abs(a - b) for g, e in zip(plain, expected) for a, b in zip(g, e)) > 0.1  # the sinks show
    for ranges in sorted({1, min(3, n_pos)}):
        for kernels in [None] + VARIANTS:
            got = kernel_attention(q, k, v, n_pos, head_dim, ranges, kernels, 0, *kv, sinks=sinks)
            diff = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
            assert diff < 2e-5, (ranges, kernels, diff)


@pytest.mark.parametrize("kv", [("f16", "f16"), ("q8_0", "q4_0")], ids=["f16/f16", "q8_0/q4_0"])
@pytest.mark.parametrize("softcap", [2.0, 50.0])
def test_soft_capped_scores_in_every_variant(softcap, kv):
    """Gemma 2's soft cap, c·tanh(score / c), over scores of about ±2: a cap of 2 bends
    them (and changes the outputs), one of 50 barely. The reference and every variant
    against the Python model, over several ranges and a partial key block."""
    rng = random.Random(int(softcap))
    n_pos, group, head_dim = 150, 3, 64
    k = [f32(rng.gauss(0, 1)) for _ in range(n_pos * head_dim)]
    v = [f32(rng.gauss(0, 1)) for _ in range(n_pos * head_dim)]
    q = [[f32(rng.gauss(0, 2)) for _ in range(head_dim)] for _ in range(group)]
    keys = stored(kv[0], [k[p * head_dim:(p + 1) * head_dim] for p in range(n_pos)])
    values = stored(kv[1], [v[p * head_dim:(p + 1) * head_dim] for p in range(n_pos)])
    expected = [softmax_attention(met_by(kv[0], h), keys, values, softcap=softcap) for h in q]
    if softcap < 10:
        plain = [softmax_attention(met_by(kv[0], h), keys, values) for h in q]
        assert max(abs(a - b) for g, e in zip(plain, expected) for a, b in zip(g, e)) > 0.1  # the cap shows
    for ranges in (1, 3):
        for kernels in [None] + VARIANTS:
            got = kernel_attention(q, k, v, n_pos, head_dim, ranges, kernels, 0, *kv, softcap=softcap)
            diff = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
            assert diff < 2e-5, (ranges, kernels, diff)


@pytest.mark.parametrize("kv", KV_PAIRS, ids=["/".join(p) for p in KV_PAIRS])
@pytest.mark.parametrize("kernels", VARIANTS)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_fast_attention_gives_the_same_bits_whether_positions_are_in_one_buffer_or_in_runs(group, kernels, kv):
    """A paged cache hands the kernel a range as pool blocks of 64 positions; a
    contiguous cache as one buffer. Runs of whole 64-position blocks are read as one
    sequence, so the bits cannot depend on where memory breaks (ranges start at
    multiples of 64 here, as the engine's ranges of 256 positions do)."""
    rng = random.Random(group)
    n_pos, head_dim = 250, 64
    k = [rng.gauss(0, 1) for _ in range(n_pos * head_dim)]
    v = [rng.gauss(0, 1) for _ in range(n_pos * head_dim)]
    q = [[f32(rng.gauss(0, 2)) for _ in range(head_dim)] for _ in range(group)]
    for ranges in (1, 2):
        whole = kernel_attention(q, k, v, n_pos, head_dim, ranges, kernels, 0, *kv)
        assert kernel_attention(q, k, v, n_pos, head_dim, ranges, kernels, 64, *kv) == whole


@pytest.mark.parametrize("kv", KV_PAIRS, ids=["/".join(p) for p in KV_PAIRS])
@pytest.mark.parametrize("kernels", VARIANTS)
@pytest.mark.parametrize("head_dim, group, n_pos", [(64, 4, 128), (128, 2, 128), (128, 2, 200), (64, 1, 77)])
def test_fast_attention_gives_each_query_head_the_same_bits_whatever_shares_its_call(head_dim, group, n_pos, kernels,
                                                                                     kv):
    """A prefill attends up to 8 query heads of consecutive tokens in one call (the
    tokens' groups side by side), a decode step only its own group: every head's
    output must be the same bits either way, or prefill and decode would differ."""
    rng = random.Random(head_dim * 7 + group * 3 + n_pos)
    k = [rng.gauss(0, 1) for _ in range(n_pos * head_dim)]
    v = [rng.gauss(0, 1) for _ in range(n_pos * head_dim)]
    q = [[f32(rng.gauss(0, 2)) for _ in range(head_dim)] for _ in range(8)]
    for ranges in (1, 2):
        together = kernel_attention(q, k, v, n_pos, head_dim, ranges, kernels, 0, *kv)
        alone = [h for i in range(0, 8, group)
                 for h in kernel_attention(q[i:i + group], k, v, n_pos, head_dim, ranges, kernels, 0, *kv)]
        assert together == alone, ranges


def test_bad_attention_arguments_raise():
    k = [0.0] * 64
    with pytest.raises(EngineError, match="bad attention arguments"):
        kernel_attention([[0.0] * 64], k, k, 1, 64, 2, VARIANTS[-1])  # more ranges than rows
    with pytest.raises(EngineError, match="bad attention arguments"):
        kernel_attention([[0.0] * 64], k, k, 1, 64, 0, VARIANTS[-1])
    with pytest.raises(EngineError, match="bad attention arguments"):
        kernel_attention([[0.0] * 64], k, k, 1, 64, 1, VARIANTS[-1], run=24)  # runs must hold whole key blocks
    for softcap in (-1.0, math.inf, math.nan):
        with pytest.raises(EngineError, match="bad attention arguments"):
            kernel_attention([[0.0] * 64], k, k, 1, 64, 1, VARIANTS[-1], softcap=softcap)
    with pytest.raises(EngineError, match=r"unknown KV type \(allowed: f16, q8_0, q4_0\)"):
        kernel_attention([[0.0] * 64], k, k, 1, 64, 1, VARIANTS[-1], 0, "q5_0", "f16")
    with pytest.raises(EngineError, match="multiple of 32"):
        kernel_attention([[0.0] * 40], k, k, 1, 40, 1, VARIANTS[-1], 0, "f16", "q8_0")


@pytest.mark.parametrize("with_up", [True, False], ids=["times_up", "alone"])
@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu"])
def test_fast_glu_matches_reference_and_the_python_formula(gelu, with_up):
    """act(gate) * up, or act(gate) alone (up None, as the recurrent blocks' SiLU runs),
    over gates from -30 to 30 (both tails saturate) and 37 elements (two vectors and a
    scalar rest): the reference and the fast kernel within 2e-7 · |gate · up| of the
    formula in double precision (the reference's 1 + tanh cancels where GELU's tail is
    tiny: an absolute error, not a relative one)."""
    rng = random.Random(7)
    gate = [f32(g) for g in [-30.0, -12.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 12.0, 30.0]] + \
           [f32(rng.gauss(0, 3)) for _ in range(28)]
    up = [f32(rng.gauss(0, 1)) for _ in gate] if with_up else None

    def act(g):
        if gelu:
            return 0.5 * g * (1 + math.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        return g / (1 + math.exp(-g))

    ups = up if with_up else [1.0] * len(gate)
    expected = [act(g) * u for g, u in zip(gate, ups)]
    for kernels in [None] + VARIANTS:
        got = kernel_glu(gelu, gate, up, kernels)
        worst = max(abs(x - e) / max(abs(g * u), 1e-30) for x, e, g, u in zip(got, expected, gate, ups))
        assert worst < 2e-7, (kernels, worst)


# ---- the per-token kernels: norms, f16 rows for the cache, activation quantization ------------

@pytest.mark.parametrize("n", [576, 64, 37])
def test_rmsnorm_of_every_variant_matches_reference(n):
    """All sum the squares in double precision, in different orders, and round the
    scale to float: within one float rounding (2^-23 relative) of each other, and of
    the formula in double precision. 37: vectors and a scalar rest."""
    rng = random.Random(n)
    x = [f32(rng.gauss(0, 3)) for _ in range(n)]
    w = [f32(rng.gauss(1, 0.2)) for _ in range(n)]
    scale = 1 / math.sqrt(math.fsum(v * v for v in x) / n + 1e-5)
    expected = [v * scale * g for v, g in zip(x, w)]
    ref = kernel_rmsnorm(x, w, 1e-5, None)
    for kernels in VARIANTS:
        fast = kernel_rmsnorm(x, w, 1e-5, kernels)
        worst = max(abs(a - b) / abs(b) for a, b in zip(fast, ref) if b != 0.0)
        off = max(abs(a - e) / abs(e) for a, e in zip(fast, expected) if e != 0.0)
        print(f"rmsnorm {kernels} n={n}: vs reference {worst:.3g}, vs formula {off:.3g} (relative)")
        assert worst <= 2 ** -23 and off < 4e-7, (kernels, worst, off)


def test_f16_rows_of_every_variant_give_the_reference_bits():
    """The cache's rows in f16: rounding to nearest even at every edge (ties,
    subnormals, the largest half, overflow to inf), the same bits from every variant."""
    rng = random.Random(5)
    edges = [0.0, -0.0, 1.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 65504.0, 65519.0, 65520.0, 1e9, -1e9, 2 ** -24,
             2 ** -25, 3 * 2 ** -26, 6e-8, -6e-5, float("inf"), float("-inf")]
    x = [f32(v) for v in edges] + [f32(rng.gauss(0, 1) * 10 ** rng.uniform(-8, 5)) for _ in range(300)]
    ref = kernel_kv_row("f16", x, None)
    assert ref == encode_f16(x)
    for kernels in VARIANTS:
        assert kernel_kv_row("f16", x, kernels) == ref, kernels


def kv_test_row(seed: int) -> list[float]:
    """Random rows of every magnitude, an all-zero block, a tie of magnitudes in either
    sign (the first one is the block's extreme), and quotients at exact halves."""
    rng = random.Random(seed)
    x = [f32(rng.gauss(0, 1) * 10 ** rng.uniform(-3, 3)) for _ in range(32 * 40)]
    x[:32] = [0.0] * 32
    x[32:64] = [f32(rng.uniform(-2, 2)) for _ in range(32)]
    x[40], x[45] = -3.0, 3.0
    x[64:96] = [127.0] + [f32(j + 0.5) for j in range(-15, 16)]  # d = 1 for Q8_0: halves
    return x


def test_q8_0_rows_of_every_variant_give_the_reference_blocks():
    """The cache's Q8_0 rows are the GGUF reference quantizer's blocks (each value within
    half a step of its block's scale, plus the scale's own rounding to f16: up to 127
    steps of 2^-11; quotients at exact halves round away from zero), and every variant
    writes the same bytes."""
    x = kv_test_row(4)
    ref = kernel_kv_row("q8_0", x, None)
    assert ref == quantize_q8_0(x)
    decoded = dequantize(GGML_Q8_0, ref, len(x))
    for b in range(len(x) // 32):
        d = abs(f16_value(struct.unpack_from("<H", ref, b * 34)[0]))
        assert all(abs(a - e) <= d * (0.5 + 127 * 2 ** -11)
                   for a, e in zip(decoded[32 * b:32 * b + 32], x[32 * b:32 * b + 32])), b
    assert list(struct.unpack_from("<32b", ref, 2 * 34 + 2)) == [127] + [
        int(math.copysign(math.floor(abs(j + 0.5) + 0.5), j + 0.5)) for j in range(-15, 16)]
    for kernels in VARIANTS:
        assert kernel_kv_row("q8_0", x, kernels) == ref, kernels


def test_q4_0_rows_fit_their_scales_and_every_variant_gives_the_same_blocks():
    """The cache's Q4_0 rows fit each block's scale (quantize.h: quantize_row_q4_0_kv):
    over Gaussian blocks, like the rotated keys and values the cache holds, they keep at
    most 92 % of the squared error of the GGUF reference's blocks (d = max / -8; 89 %
    expected), no block much worse than the reference's; an all-zero block is zeros;
    and every variant writes the same bytes, on these rows and on rows of every magnitude."""
    rng = random.Random(7)
    x = [f32(rng.gauss(0, 1)) for _ in range(32 * 400)]
    fitted = dequantize(GGML_Q4_0, kernel_kv_row("q4_0", x, None), len(x))
    reference = dequantize(GGML_Q4_0, quantize_q4_0(x), len(x))

    def squared_error(decoded, b):
        return sum((a - e) ** 2 for a, e in zip(decoded[32 * b:32 * b + 32], x[32 * b:32 * b + 32]))

    ours = [squared_error(fitted, b) for b in range(len(x) // 32)]
    theirs = [squared_error(reference, b) for b in range(len(x) // 32)]
    print(f"q4_0 KV squared error: {sum(ours) / sum(theirs):.4f} of the reference's; worst block "
          f"{max(o / t for o, t in zip(ours, theirs)):.3f}")
    assert sum(ours) <= 0.92 * sum(theirs)
    assert all(o <= 1.25 * t for o, t in zip(ours, theirs))
    for row in (x, kv_test_row(5)):
        ref = kernel_kv_row("q4_0", row, None)
        for kernels in VARIANTS:
            assert kernel_kv_row("q4_0", row, kernels) == ref, kernels
    assert kernel_kv_row("q4_0", kv_test_row(5), None)[:18] == bytes(2) + b"\x88" * 16


@pytest.mark.parametrize("group", [32, 256])
def test_activation_quantization_of_every_variant_gives_the_reference_blocks(group):
    """The integer kernels' int8 activations: every variant rounds and saturates as the
    scalar one does, so values, scales and sums are the same bits; rows with a zero
    group, ties at .5 and a value that is the group's maximum in either sign."""
    rng = random.Random(group)
    x = [f32(rng.gauss(0, 2)) for _ in range(1024)]
    x[:group] = [0.0] * group  # an all-zero group: d = 0
    x[group:group + 4] = [127.0, -127.0, 0.5, -2.5]  # d = 1: exact ties round to even
    ref = kernel_quantize(x, group, None)
    for kernels in VARIANTS:
        assert kernel_quantize(x, group, kernels) == ref, kernels
    qs, d, sums = ref
    assert qs[group:group + 4] == [127, -127, 0, -2] and d[group // 32] == 1.0
    for b in range(len(d)):
        assert sums[2 * b] == sum(qs[32 * b:32 * b + 32]) and sums[2 * b + 1] == sum(qs[32 * b:32 * b + 16])
        assert all(abs(x[32 * b + j] - d[b] * qs[32 * b + j]) <= d[b] / 2 * (1 + 1e-6) for j in range(32))


def test_bad_per_token_kernel_arguments_raise():
    with pytest.raises(EngineError, match="bad quantize arguments"):
        kernel_quantize([0.0] * 48, 32, VARIANTS[-1])  # not a whole number of groups
    with pytest.raises(EngineError, match="bad quantize arguments"):
        kernel_quantize([0.0] * 64, 64, VARIANTS[-1])
    with pytest.raises(EngineError, match="bad rmsnorm arguments"):
        kernel_rmsnorm([], [], 1e-5, VARIANTS[-1])
    with pytest.raises(EngineError, match="no kernel variant"):
        kernel_kv_row("f16", [1.0], "no-such-variant")
    with pytest.raises(EngineError, match="multiple of 32"):
        kernel_kv_row("q8_0", [1.0] * 48, None)

# ---- choosing the variant ------------------------------------------------------------------

def open_with_kernels(model_path: str, kernels: str) -> subprocess.CompletedProcess:
    """An engine opened in a process of its own (the choice is made once per process)
    with LLMD_KERNELS set: prints the variant it runs, or the error."""
    code = ("import sys\nfrom llmd.engine.native import Engine, EngineError\n"
            "try:\n    e = Engine(sys.argv[1], n_threads=1, max_sessions=1)\n"
            "except EngineError as exc:\n    print('error:', exc)\nelse:\n    print(e.info.kernels)\n    e.close()\n")
    return subprocess.run([sys.executable, "-c", code, model_path], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LLMD_KERNELS": kernels}, check=True)


def test_the_engine_runs_the_fastest_variant_the_cpu_runs_unless_llmd_kernels_names_one(tiny_model):
    default = open_with_kernels(tiny_model.path, "").stdout.strip()
    assert default == VARIANTS[-1]
    for name in VARIANTS:
        assert open_with_kernels(tiny_model.path, name).stdout.strip() == name


def test_llmd_kernels_naming_a_variant_the_cpu_or_build_lacks_is_refused_with_what_it_runs(tiny_model):
    refused = open_with_kernels(tiny_model.path, "no-such-variant").stdout
    assert "LLMD_KERNELS=no-such-variant: no kernel variant no-such-variant in this build" in refused
    assert "this CPU runs: " + ", ".join(VARIANTS) in refused
    lacking = [v.name for v in kernel_variants() if not v.runs]
    if lacking:
        refused = open_with_kernels(tiny_model.path, lacking[0]).stdout
        assert f"this CPU lacks the instructions of kernel variant {lacking[0]}" in refused
