"""Matrix kernels: the fast path (repacked panels on AVX-512 VNNI builds, row dot
products elsewhere) against the scalar reference, and the reference against a
pure-Python model, through llmd.engine.kernel_matmul.

For quantized weights (Q4_0, Q4_1, Q8_0) the engine first quantizes x per block
of 32 to int8 (d = amax / 127 in float32, q = round-to-nearest-even of x / d); the
Python model does exactly that, dequantizes the weights with the test writer's
decoders and takes the dot product in double precision.

Tolerances, relative to S = sum |w_i * x_i| over the row (the size of the
rounding any summation order can cause):
  fast vs reference: 4e-6 * S. Both share the quantized x; the fast path sums in
    float32, at most 64 roundings per lane here (32 blocks, and Q4_1 adds its
    offset term per block): 64 * 2^-24 < 4e-6.
  reference vs model: 3e-7 * S. The reference sums in double and rounds once to
    float (2^-24 of |y| <= S); Q4_1's offset uses s = d * sum(q) rounded to
    float (another 2^-24 of |m * s|, which S counts for Q4_1); the rest is margin.
"""
from __future__ import annotations

import math
import random
import struct

import pytest

from llmd.engine import EngineError, kernel_attention, kernel_matmul
from tests.gguf_writer import (
    GGML_F16, GGML_F32, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, QK, TYPE_LAYOUT, TYPE_NAMES, dequantize,
    encode_f16, encode_f32, f16_bits, f16_value, f32, pack_q4_0, pack_q4_1, pack_q8_0, quantize_q4_0,
    quantize_q4_1, quantize_q8_0, row_bytes,
)

FAST_TOL = 4e-6
MODEL_TOL = 3e-7

TYPES = [GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0]
QUANTIZED = (GGML_Q4_0, GGML_Q4_1, GGML_Q8_0)

F16_MAX, F16_MIN_SUBNORMAL = 0x7BFF, 0x0001  # 65504 and 2^-24


# ---- inputs ------------------------------------------------------------------------------

def random_f16_bits(rng: random.Random) -> int:
    """Any finite half: zeros, subnormals, normals up to ±65504."""
    while True:
        h = rng.randrange(1 << 16)
        if (h >> 10) & 0x1F != 0x1F:
            return h


def random_block(ggml_type: int, rng: random.Random) -> bytes:
    """One block of a quantized type, biased towards the edge cases."""
    kind = rng.choice(["encoded", "encoded", "raw", "zero", "zero_scale", "max_scale", "tiny_scale"])
    if kind == "encoded":
        scale = rng.choice([1e-3, 1.0, 50.0])
        values = [rng.gauss(0.0, scale) for _ in range(QK)]
        return {GGML_Q4_0: quantize_q4_0, GGML_Q4_1: quantize_q4_1, GGML_Q8_0: quantize_q8_0}[ggml_type](values)
    if kind == "zero":
        return bytes(TYPE_LAYOUT[ggml_type][1])
    d = {"raw": random_f16_bits(rng), "zero_scale": 0, "max_scale": rng.choice([F16_MAX, F16_MAX | 0x8000]),
         "tiny_scale": rng.choice([F16_MIN_SUBNORMAL, 0x03FF, 0x8001])}[kind]
    if ggml_type == GGML_Q8_0:
        return pack_q8_0(d, [rng.randint(-128, 127) for _ in range(QK)])
    nibbles = [rng.randrange(16) for _ in range(QK)]
    if ggml_type == GGML_Q4_0:
        return pack_q4_0(d, nibbles)
    m = rng.choice([0, random_f16_bits(rng), F16_MAX | 0x8000, F16_MIN_SUBNORMAL, d])
    return pack_q4_1(d, m, nibbles)


def random_weights(ggml_type: int, rows: int, cols: int, rng: random.Random) -> bytes:
    if ggml_type == GGML_F32:
        return encode_f32([rng.gauss(0.0, 1.0) * rng.choice([1e-30, 1e-3, 1.0, 1e3, 1e12]) if rng.random() > 0.05
                           else 0.0 for _ in range(rows * cols)])
    if ggml_type == GGML_F16:
        return struct.pack(f"<{rows * cols}H", *(random_f16_bits(rng) for _ in range(rows * cols)))
    return b"".join(random_block(ggml_type, rng) for _ in range(rows * cols // QK))


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

def quantize_x(x: list[float]) -> list[float]:
    """x as the engine's int8 activation blocks see it: d * q, d and q as C computes them."""
    out = []
    for b in range(0, len(x), QK):
        block = x[b:b + QK]
        d = f32(max(abs(v) for v in block) / 127.0)
        inv = f32(1.0 / d) if d != 0.0 else 0.0
        out += [d * round(f32(v * inv)) for v in block]  # round(): nearest, ties to even
    return out


def kernel_matvec(ggml_type: int, weights: bytes, rows: int, cols: int, x: list[float],
                  fast: bool) -> list[float]:
    return kernel_matmul(ggml_type, weights, rows, cols, [x], fast)[0]


def model_matvec(ggml_type: int, weights: bytes, rows: int, cols: int, x: list[float]) -> list[float]:
    xs = quantize_x(x) if ggml_type in QUANTIZED else x
    stride = row_bytes(ggml_type, cols)
    y = []
    for r in range(rows):
        w = dequantize(ggml_type, weights[r * stride:(r + 1) * stride], cols)
        y.append(math.fsum(wi * xi for wi, xi in zip(w, xs)))
    return y


def magnitude(ggml_type: int, weights: bytes, rows: int, cols: int, x: list[float]) -> list[float]:
    """S per row: sum |w_i * x_i| with x as the kernel sees it, plus for Q4_1 the
    terms |m * s| per block that the kernels form (w = q * d + m, s = sum of x)."""
    xs = quantize_x(x) if ggml_type in QUANTIZED else x
    stride = row_bytes(ggml_type, cols)
    out = []
    for r in range(rows):
        row = weights[r * stride:(r + 1) * stride]
        s = math.fsum(abs(wi * xi) for wi, xi in zip(dequantize(ggml_type, row, cols), xs))
        if ggml_type == GGML_Q4_1:
            size = TYPE_LAYOUT[GGML_Q4_1][1]
            s += math.fsum(abs(f16_value(struct.unpack_from("<H", row, b * size + 2)[0])
                               * math.fsum(xs[b * QK:(b + 1) * QK])) for b in range(cols // QK))
        out.append(s)
    return out


def worst(a: list[float], b: list[float], scale: list[float]) -> tuple[float, float]:
    """(max |a - b|, max |a - b| / S)."""
    diffs = [abs(p - q) for p, q in zip(a, b)]
    return max(diffs), max(d / s if s else (math.inf if d else 0.0) for d, s in zip(diffs, scale))


SHAPES = {
    GGML_F32: [(16, 256), (3, 37), (2, 8), (1, 1)],
    GGML_F16: [(16, 256), (3, 37), (2, 8), (1, 1)],
    GGML_Q4_0: [(16, 256), (4, 32), (2, 1024), (37, 64)],
    GGML_Q4_1: [(16, 256), (4, 32), (2, 1024), (37, 64)],
    GGML_Q8_0: [(16, 256), (4, 32), (2, 1024), (37, 64)],
}


@pytest.mark.parametrize("ggml_type", TYPES, ids=[TYPE_NAMES[t] for t in TYPES])
def test_fast_kernel_matches_reference_and_reference_matches_python_model(ggml_type):
    rng = random.Random(1000 + ggml_type)
    worst_fast = worst_model = (0.0, 0.0)
    for rows, cols in SHAPES[ggml_type]:
        for n_tokens in (1, 2, 7):  # every token tile size of the prefill kernels
            weights = random_weights(ggml_type, rows, cols, rng)
            xs = [random_x(cols, rng) for _ in range(n_tokens)]
            fasts = kernel_matmul(ggml_type, weights, rows, cols, xs, fast=True)
            refs = kernel_matmul(ggml_type, weights, rows, cols, xs, fast=False)
            for x, fast, ref in zip(xs, fasts, refs):
                model = model_matvec(ggml_type, weights, rows, cols, x)
                scale = magnitude(ggml_type, weights, rows, cols, x)
                assert all(math.isfinite(v) for v in fast + ref)
                wf, wm = worst(fast, ref, scale), worst(ref, model, scale)
                worst_fast = max(worst_fast, wf, key=lambda t: t[1])
                worst_model = max(worst_model, wm, key=lambda t: t[1])
                assert wf[1] <= FAST_TOL, (rows, cols, fast, ref)
                assert wm[1] <= MODEL_TOL, (rows, cols, ref, model)
    print(f"{TYPE_NAMES[ggml_type]}: fast vs ref max diff {worst_fast[0]:.3g} ({worst_fast[1]:.3g} of S); "
          f"ref vs model max diff {worst_model[0]:.3g} ({worst_model[1]:.3g} of S)")


@pytest.mark.parametrize("ggml_type", TYPES, ids=[TYPE_NAMES[t] for t in TYPES])
def test_all_zero_weights_give_zero(ggml_type):
    cols = 64
    weights = bytes(row_bytes(ggml_type, cols) * 2)
    x = random_x(cols, random.Random(1))
    for fast in (True, False):
        assert kernel_matvec(ggml_type, weights, 2, cols, x, fast=fast) == [0.0, 0.0]


@pytest.mark.parametrize("ggml_type", QUANTIZED, ids=[TYPE_NAMES[t] for t in QUANTIZED])
def test_block_layout_matches_the_writer(ggml_type):
    """A one-hot x reads back one weight: the writer's element k is the engine's."""
    rng = random.Random(ggml_type)
    block = random_block(ggml_type, rng)
    while dequantize(ggml_type, block, QK) == [0.0] * QK:
        block = random_block(ggml_type, rng)
    expected = dequantize(ggml_type, block, QK)
    for k in range(QK):
        x = [0.0] * QK
        x[k] = 1.0  # quantizes to q = 127, d = 1/127: x reads back as 1 within float rounding
        for fast in (True, False):
            [y] = kernel_matvec(ggml_type, block, 1, QK, x, fast=fast)
            assert y == pytest.approx(expected[k], rel=1e-6, abs=1e-30), (k, fast)


def test_f16_kernel_reads_halves_as_the_writer_writes_them():
    values = [0.0, 1.0, -2.5, 65504.0, 2.0 ** -24, -(2.0 ** -14), 0.333251953125, 1000.5]
    weights = encode_f16(values)
    for k, v in enumerate(values):
        x = [0.0] * len(values)
        x[k] = 1.0
        for fast in (True, False):
            assert kernel_matvec(GGML_F16, weights, 1, len(values), x, fast=fast) == [v]


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


@pytest.mark.parametrize("ggml_type, rows, cols, match", [
    (GGML_Q8_0, 2, 48, "bad matrix arguments"),
    (GGML_Q4_0, 2, 16, "bad matrix arguments"),
    (GGML_Q4_1, 2, 33, "bad matrix arguments"),
    (GGML_F32, 0, 32, "bad matrix arguments"),
    (GGML_Q8_0, 0, 32, "bad matrix arguments"),
    (GGML_F16, 2, 0, "bad matrix arguments"),
    (99, 2, 32, "unsupported tensor type 99"),
    (12, 2, 256, "unsupported tensor type 12"),
    (-1, 2, 32, "unsupported tensor type -1"),
])
def test_bad_kernel_arguments_raise(ggml_type, rows, cols, match):
    weights = bytes(4096)  # large enough that a missed check could not read past it
    with pytest.raises(EngineError, match=match):
        kernel_matvec(ggml_type, weights, rows, cols, [1.0] * max(cols, 1), fast=True)


# ---- attention ----------------------------------------------------------------------------

def softmax_attention(q: list[float], keys: list[list[float]], values: list[list[float]]) -> list[float]:
    """One query head's causal-attention output, in double precision."""
    scores = [math.fsum(a * b for a, b in zip(q, k)) / math.sqrt(len(q)) for k in keys]
    top = max(scores)
    weights = [math.exp(sc - top) for sc in scores]
    total = math.fsum(weights)
    return [math.fsum(w * v[d] for w, v in zip(weights, values)) / total for d in range(len(q))]


@pytest.mark.parametrize("n_pos, head_dim, spread, group", [
    (1, 64, 1.0, 3), (63, 64, 1.0, 3), (65, 64, 1.0, 3), (300, 64, 8.0, 3), (130, 32, 1.0, 3), (40, 40, 1.0, 3),
    (70, 64, 1.0, 1), (70, 64, 4.0, 8), (70, 64, 1.0, 5), (70, 32, 1.0, 16)])
def test_fast_attention_matches_reference_and_the_python_model(n_pos, head_dim, spread, group):
    """spread scales the scores: 8 makes softmax nearly one-hot, where a wrong running
    max or rescaling shows at once. head_dim 40 takes the reference path. group is the
    number of query heads sharing the keys: the fast kernel is compiled for common
    sizes (1, 3, 8) and runs any other (5, 16) through its general form."""
    rng = random.Random(n_pos * 1000 + head_dim + group)
    half = lambda x: f16_value(f16_bits(x))
    keys = [[half(rng.gauss(0, 1)) for _ in range(head_dim)] for _ in range(n_pos)]
    values = [[half(rng.gauss(0, 1)) for _ in range(head_dim)] for _ in range(n_pos)]
    q = [[f32(rng.gauss(0, spread)) for _ in range(head_dim)] for _ in range(group)]
    k = encode_f16([x for row in keys for x in row])
    v = encode_f16([x for row in values for x in row])
    expected = [softmax_attention(h, keys, values) for h in q]
    for ranges in sorted({1, min(3, n_pos)}):
        for fast in (False, True):
            got = kernel_attention(q, k, v, n_pos, head_dim, ranges, fast)
            diff = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
            assert diff < 2e-5, (ranges, fast, diff)


def test_bad_attention_arguments_raise():
    k = encode_f16([0.0] * 64)
    with pytest.raises(EngineError, match="bad attention arguments"):
        kernel_attention([[0.0] * 64], k, k, 1, 64, 2, True)  # more ranges than rows
    with pytest.raises(EngineError, match="bad attention arguments"):
        kernel_attention([[0.0] * 64], k, k, 1, 64, 0, True)
