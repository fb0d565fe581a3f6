"""A small GGUF v3 writer for tests, standard library only.

Layout written (little-endian), as native/src/format/gguf.cpp reads it:
  magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
  n_kv × { string key, u32 value type, value },
  n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset },
  zero padding to `general.alignment` (32 if absent), then the data section, every
  tensor's data starting at an aligned offset. The file ends right after the last
  tensor's data, so any truncation loses bytes the reader needs.

`GGUFWriter` holds metadata and tensors as editable lists, so a test can build a
valid file and then break exactly one thing (drop a key, retype it, add a
duplicate, misplace an offset) before calling `to_bytes()`; `layout` then records
where every section and entry starts, for tests that cut or flip bytes.

`write_tiny_llama()` writes a random-weight llama model with a real byte-level
BPE vocabulary (the 256 GPT-2 byte characters, merges learned from a short
English text, three ChatML control tokens), small enough to write and load in
milliseconds.
"""
from __future__ import annotations

import math
import random
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

# ---- value and tensor types ------------------------------------------------

# GGUF metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)

_SCALAR_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
                   F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

# ggml tensor types the engine computes with, numbered as GGUF numbers them.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8
GGML_Q5_0, GGML_Q5_1, GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 6, 7, 10, 11, 12, 13, 14
GGML_IQ4_NL, GGML_IQ4_XS, GGML_BF16, GGML_MXFP4 = 20, 23, 30, 39
GGML_IQ2_XXS = 16  # one the engine has no kernels for

QK = 32  # elements per quantized block
QK_K = 256  # elements per K-quant super-block

# (elements per block, bytes per block)
TYPE_LAYOUT = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (QK, 18), GGML_Q4_1: (QK, 20),
               GGML_Q5_0: (QK, 22), GGML_Q5_1: (QK, 24), GGML_Q8_0: (QK, 34), GGML_Q2_K: (QK_K, 84),
               GGML_Q3_K: (QK_K, 110), GGML_Q4_K: (QK_K, 144), GGML_Q5_K: (QK_K, 176),
               GGML_Q6_K: (QK_K, 210), GGML_IQ2_XXS: (QK_K, 66), GGML_IQ4_NL: (QK, 18),
               GGML_IQ4_XS: (QK_K, 136), GGML_BF16: (1, 2), GGML_MXFP4: (QK, 17)}

TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q4_0: "Q4_0", GGML_Q4_1: "Q4_1", GGML_Q5_0: "Q5_0",
              GGML_Q5_1: "Q5_1", GGML_Q8_0: "Q8_0", GGML_Q2_K: "Q2_K", GGML_Q3_K: "Q3_K", GGML_Q4_K: "Q4_K",
              GGML_Q5_K: "Q5_K", GGML_Q6_K: "Q6_K", GGML_IQ2_XXS: "IQ2_XXS", GGML_IQ4_NL: "IQ4_NL",
              GGML_IQ4_XS: "IQ4_XS", GGML_BF16: "BF16", GGML_MXFP4: "MXFP4"}

# general.file_type of a file whose matrices are all of one type (llama.cpp's ftype numbers)
FILE_TYPES = {GGML_F32: 0, GGML_F16: 1, GGML_Q4_0: 2, GGML_Q4_1: 3, GGML_Q8_0: 7, GGML_Q5_0: 8,
              GGML_Q5_1: 9, GGML_Q2_K: 10, GGML_Q3_K: 12, GGML_Q4_K: 15, GGML_Q5_K: 17, GGML_Q6_K: 18,
              GGML_IQ4_NL: 25, GGML_IQ4_XS: 30, GGML_BF16: 32, GGML_MXFP4: 38}


def row_bytes(ggml_type: int, n: int) -> int:
    """Bytes of a row of n elements (n a whole number of blocks)."""
    elems, size = TYPE_LAYOUT[ggml_type]
    assert n % elems == 0, (ggml_type, n)
    return n // elems * size


# ---- encoding ----------------------------------------------------------------

def encode_string(s: str | bytes) -> bytes:
    data = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(data)) + data


def encode_value(vtype: int, value) -> bytes:
    """One metadata value. An ARRAY value is (element type, items); items of an
    array of arrays are themselves (element type, items) pairs."""
    if vtype == STRING:
        return encode_string(value)
    if vtype == ARRAY:
        elem_type, items = value
        return encode_array_header(elem_type, len(items)) + b"".join(
            encode_value(elem_type, item) for item in items)
    return struct.pack(_SCALAR_FORMATS[vtype], value)


def encode_array_header(elem_type: int, count: int) -> bytes:
    return struct.pack("<IQ", elem_type, count)


def encode_kv(key: str | bytes, vtype: int, value) -> bytes:
    return encode_string(key) + struct.pack("<I", vtype) + encode_value(vtype, value)


def encode_tensor_info(name: str | bytes, ne: list[int], ggml_type: int, offset: int) -> bytes:
    out = encode_string(name) + struct.pack("<I", len(ne))
    out += b"".join(struct.pack("<Q", n) for n in ne)
    return out + struct.pack("<IQ", ggml_type, offset)


def encode_header(n_tensors: int, n_kv: int, *, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


# ---- the writer --------------------------------------------------------------

@dataclass
class KV:
    key: str
    vtype: int
    value: object
    raw: bytes | None = None  # when set, written instead of the encoded value


@dataclass
class Tensor:
    name: str
    ne: list[int]     # ne[0] is the contiguous (row) dimension
    ggml_type: int
    data: bytes
    offset: int | None = None  # relative to the data section; None: next aligned offset


@dataclass
class Layout:
    """Absolute byte offsets of what to_bytes() wrote."""
    kv_offsets: list[int] = field(default_factory=list)
    tensor_info_offsets: list[int] = field(default_factory=list)
    infos_end: int = 0
    data_start: int = 0
    tensor_offsets: dict[str, int] = field(default_factory=dict)  # absolute data offsets
    size: int = 0


class GGUFWriter:
    """Metadata and tensors as editable lists; to_bytes() lays them out."""

    def __init__(self, *, version: int = 3, magic: bytes = b"GGUF"):
        self.version = version
        self.magic = magic
        self.kvs: list[KV] = []
        self.tensors: list[Tensor] = []
        self.n_kv_override: int | None = None       # header counts, for hostile files
        self.n_tensors_override: int | None = None
        self.layout = Layout()

    # metadata
    def set(self, key: str, vtype: int, value) -> None:
        """Adds key, or replaces its first occurrence in place."""
        for kv in self.kvs:
            if kv.key == key:
                kv.vtype, kv.value, kv.raw = vtype, value, None
                return
        self.kvs.append(KV(key, vtype, value))

    def append(self, key: str, vtype: int, value, raw: bytes | None = None) -> None:
        """Adds key even if present (duplicate keys are for hostile files)."""
        self.kvs.append(KV(key, vtype, value, raw))

    def remove(self, key: str) -> None:
        self.kvs = [kv for kv in self.kvs if kv.key != key]

    def get(self, key: str) -> KV:
        return next(kv for kv in self.kvs if kv.key == key)

    # tensors
    def add_tensor(self, name: str, ne: list[int], ggml_type: int, data: bytes,
                   offset: int | None = None) -> None:
        self.tensors.append(Tensor(name, list(ne), ggml_type, data, offset))

    def remove_tensor(self, name: str) -> None:
        self.tensors = [t for t in self.tensors if t.name != name]

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    @property
    def alignment(self) -> int:
        """The alignment the data is laid out with: general.alignment when it is a
        usable power of two, else the GGUF default of 32 (the file may still
        declare a hostile value)."""
        for kv in self.kvs:
            if kv.key == "general.alignment" and kv.vtype in (U32, I32, U64) and kv.raw is None:
                v = kv.value
                if 0 < v <= 1 << 20 and v & (v - 1) == 0:
                    return v
        return 32

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks())

    def chunks(self):
        """The file's bytes in pieces: the header and infos, then each tensor's padding
        and data (so that writing a model of gigabytes never holds a second copy)."""
        align = self.alignment
        lay = Layout()
        n_kv = len(self.kvs) if self.n_kv_override is None else self.n_kv_override
        n_tensors = len(self.tensors) if self.n_tensors_override is None else self.n_tensors_override
        out = bytearray(encode_header(n_tensors, n_kv, magic=self.magic, version=self.version))
        for kv in self.kvs:
            lay.kv_offsets.append(len(out))
            if kv.raw is not None:
                out += encode_string(kv.key) + struct.pack("<I", kv.vtype) + kv.raw
            else:
                out += encode_kv(kv.key, kv.vtype, kv.value)

        # Data offsets first: the infos name them.
        offsets, cursor = [], 0
        for t in self.tensors:
            cursor = (cursor + align - 1) // align * align
            offsets.append(cursor if t.offset is None else t.offset)
            cursor += len(t.data)
        for t, off in zip(self.tensors, offsets):
            lay.tensor_info_offsets.append(len(out))
            out += encode_tensor_info(t.name, t.ne, t.ggml_type, off)
        lay.infos_end = len(out)

        lay.data_start = (len(out) + align - 1) // align * align
        out += bytes(lay.data_start - len(out))
        self.layout = lay
        yield bytes(out)
        cursor = 0
        for t in self.tensors:  # data always in list order at the computed places
            cursor_aligned = (cursor + align - 1) // align * align
            yield bytes(cursor_aligned - cursor)
            lay.tensor_offsets[t.name] = lay.data_start + cursor_aligned
            yield t.data
            cursor = cursor_aligned + len(t.data)
        lay.size = lay.data_start + cursor

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        with open(path, "wb") as f:
            for chunk in self.chunks():
                f.write(chunk)
        return path


# ---- f16 and block formats -----------------------------------------------------

def f32(x: float) -> float:
    """x rounded to float32, as C++ float arithmetic rounds each result."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_bits(x: float) -> int:
    """x rounded to half precision (nearest even); out-of-range values become ±inf."""
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0xFC00 if x < 0 else 0x7C00


def f16_value(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def _round_away(x: float) -> int:
    """roundf: halves away from zero (ggml's quantizers use it)."""
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def encode_f32(values) -> bytes:
    return array("f", values).tobytes()


def encode_f16(values) -> bytes:
    return struct.pack(f"<{len(values)}H", *(f16_bits(v) for v in values))


def quantize_q8_0(values) -> bytes:
    """Blocks of f16 d + 32 int8: x = q * d, d = amax / 127 (ggml's reference)."""
    out = bytearray()
    for b in range(0, len(values), QK):
        blk = values[b:b + QK]
        amax = max(abs(v) for v in blk)
        d = amax / 127.0
        inv = 1.0 / d if d else 0.0
        out += struct.pack("<H", f16_bits(d))
        out += struct.pack("<32b", *(max(-128, min(127, _round_away(v * inv))) for v in blk))
    return bytes(out)


def quantize_q4_0(values) -> bytes:
    """Blocks of f16 d + 16 nibble bytes: x = (q - 8) * d; low nibbles hold
    elements 0..15, high nibbles 16..31 (ggml's reference: d = max / -8)."""
    out = bytearray()
    for b in range(0, len(values), QK):
        blk = values[b:b + QK]
        vmax = max(blk, key=abs)
        d = vmax / -8.0
        inv = 1.0 / d if d else 0.0
        q = [min(15, int(v * inv + 8.5)) for v in blk]
        out += struct.pack("<H", f16_bits(d))
        out += bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return bytes(out)


def quantize_q4_1(values) -> bytes:
    """Blocks of f16 d, f16 m + 16 nibble bytes: x = q * d + m."""
    out = bytearray()
    for b in range(0, len(values), QK):
        blk = values[b:b + QK]
        lo, hi = min(blk), max(blk)
        d = (hi - lo) / 15.0
        inv = 1.0 / d if d else 0.0
        q = [min(15, int((v - lo) * inv + 0.5)) for v in blk]
        out += struct.pack("<HH", f16_bits(d), f16_bits(lo))
        out += bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return bytes(out)


def pack_q4_0(d_bits: int, q: list[int]) -> bytes:
    """One Q4_0 block from a raw f16 scale and 32 nibbles (0..15)."""
    return struct.pack("<H", d_bits) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


def pack_q4_1(d_bits: int, m_bits: int, q: list[int]) -> bytes:
    return struct.pack("<HH", d_bits, m_bits) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


def pack_q8_0(d_bits: int, q: list[int]) -> bytes:
    return struct.pack("<H32b", d_bits, *q)


# ---- every block format, decoded by its definition ----------------------------------
#
# A "piece" is 32 consecutive elements of a row: element i = d * scale[i // 16] * q[i]
# + minimum[i // 16]. Written from the formats' definitions (ggml's block layouts),
# independently of the engine's C++.

IQ4_CODES = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # the 3 low bits of an FP4 code; bit 3 is the sign


def _half(blk: bytes, at: int) -> float:
    return f16_value(struct.unpack_from("<H", blk, at)[0])


def _split_nibbles(qs: bytes) -> list[int]:
    """16 bytes → 32 values: the low nibbles, then the high ones."""
    return [b & 15 for b in qs] + [b >> 4 for b in qs]


def _k4_scales(s: bytes) -> tuple[list[int], list[int]]:
    """Q4_K / Q5_K: eight 6-bit scales and mins packed in 12 bytes."""
    scales = [s[j] & 63 for j in range(4)] + [(s[j + 4] & 15) | (s[j - 4] >> 6) << 4 for j in range(4, 8)]
    mins = [s[j + 4] & 63 for j in range(4)] + [(s[j + 4] >> 4) | (s[j] >> 6) << 4 for j in range(4, 8)]
    return scales, mins


def _bit_pairs(qs: bytes, hmask: bytes | None = None) -> list[int]:
    """Q2_K / Q3_K: 256 2-bit values from 64 bytes: halves of 128 from 32 bytes each,
    shifts 0, 2, 4, 6 giving elements 0-31, 32-63, ...; Q3_K subtracts 4 where the
    element's bit in hmask (bit 4 h + shift / 2 of byte l) is clear."""
    out = []
    for h in range(2):
        for t in range(4):
            for l in range(32):
                q = (qs[32 * h + l] >> 2 * t) & 3
                if hmask is not None and not (hmask[l] >> (4 * h + t)) & 1:
                    q -= 4
                out.append(q)
    return out


def _q3_scales(s: bytes) -> list[int]:
    """16 6-bit scales in 12 bytes: low nibbles in bytes 0-7 (low halves first), top
    two bits in bytes 8-11 (two bits per scale, four scales per byte)."""
    return [(((s[i % 8] >> 4 * (i // 8)) & 15) | ((s[8 + i % 4] >> 2 * (i // 4)) & 3) << 4) - 32
            for i in range(16)]


def _pieces_of_block(ggml_type: int, blk: bytes) -> list[tuple[float, list[int], list[float], list[int]]]:
    def uniform(d, q, scale=1, minimum=0.0):
        return d, [scale, scale], [minimum, minimum], q

    if ggml_type == GGML_Q4_0:
        return [uniform(_half(blk, 0), [v - 8 for v in _split_nibbles(blk[2:18])])]
    if ggml_type == GGML_Q4_1:
        return [uniform(_half(blk, 0), _split_nibbles(blk[4:20]), minimum=_half(blk, 2))]
    if ggml_type in (GGML_Q5_0, GGML_Q5_1):
        first = 6 if ggml_type == GGML_Q5_0 else 8
        qh = struct.unpack_from("<I", blk, first - 4)[0]
        q = [v | ((qh >> i) & 1) << 4 for i, v in enumerate(_split_nibbles(blk[first:first + 16]))]
        if ggml_type == GGML_Q5_0:
            return [uniform(_half(blk, 0), [v - 16 for v in q])]
        return [uniform(_half(blk, 0), q, minimum=_half(blk, 2))]
    if ggml_type == GGML_Q8_0:
        return [uniform(_half(blk, 0), list(struct.unpack_from("<32b", blk, 2)))]
    if ggml_type == GGML_IQ4_NL:
        return [uniform(_half(blk, 0), [IQ4_CODES[c] for c in _split_nibbles(blk[2:18])])]
    if ggml_type == GGML_MXFP4:
        # value = 2^(e - 127) * e2m1; as an integer multiple of half a unit: 2^(e - 128) * 2 e2m1
        q = [int(2 * E2M1[c & 7]) * (-1 if c & 8 else 1) for c in _split_nibbles(blk[1:17])]
        return [uniform(2.0 ** (blk[0] - 128), q)]
    if ggml_type in (GGML_Q4_K, GGML_Q5_K):
        d, dmin = _half(blk, 0), _half(blk, 2)
        scales, mins = _k4_scales(blk[4:16])
        qs = blk[16:144] if ggml_type == GGML_Q4_K else blk[48:176]
        out = []
        for j in range(8):  # sub-block j: nibble j % 2 of bytes 32 (j // 2) ..
            chunk = qs[32 * (j // 2):32 * (j // 2) + 32]
            q = [(b >> 4 * (j % 2)) & 15 for b in chunk]
            if ggml_type == GGML_Q5_K:
                q = [v | ((blk[16 + l] >> j) & 1) << 4 for l, v in enumerate(q)]
            out.append(uniform(d, q, scales[j], -dmin * mins[j]))
        return out
    if ggml_type == GGML_Q6_K:
        ql, qh, d = blk[0:128], blk[128:192], _half(blk, 208)
        scales = list(struct.unpack_from("<16b", blk, 192))
        q = []
        for h in range(2):  # element 128 h + 32 t + l
            for t in range(4):
                for l in range(32):
                    low = (ql[64 * h + 32 * (t % 2) + l] >> 4 * (t // 2)) & 15
                    q.append((low | ((qh[32 * h + l] >> 2 * t) & 3) << 4) - 32)
        return [(d, scales[2 * j:2 * j + 2], [0.0, 0.0], q[32 * j:32 * j + 32]) for j in range(8)]
    if ggml_type == GGML_Q3_K:
        q, scales, d = _bit_pairs(blk[32:96], blk[0:32]), _q3_scales(blk[96:108]), _half(blk, 108)
        return [(d, scales[2 * j:2 * j + 2], [0.0, 0.0], q[32 * j:32 * j + 32]) for j in range(8)]
    if ggml_type == GGML_Q2_K:
        q, d, dmin = _bit_pairs(blk[16:80]), _half(blk, 80), _half(blk, 82)
        return [(d, [blk[2 * j] & 15, blk[2 * j + 1] & 15], [-dmin * (blk[2 * j] >> 4), -dmin * (blk[2 * j + 1] >> 4)],
                 q[32 * j:32 * j + 32]) for j in range(8)]
    if ggml_type == GGML_IQ4_XS:
        d, high = _half(blk, 0), struct.unpack_from("<H", blk, 2)[0]
        out = []
        for j in range(8):
            scale = (((blk[4 + j // 2] >> 4 * (j % 2)) & 15) | ((high >> 2 * j) & 3) << 4) - 32
            out.append(uniform(d, [IQ4_CODES[c] for c in _split_nibbles(blk[8 + 16 * j:24 + 16 * j])], scale))
        return out
    raise ValueError(f"no decoder for type {ggml_type}")


def pieces(ggml_type: int, data: bytes, n: int) -> list[tuple[float, list[int], list[float], list[int]]]:
    """The n // 32 pieces (d, scales, mins, q) of a quantized row of n elements."""
    elems, size = TYPE_LAYOUT[ggml_type]
    out = []
    for b in range(n // elems):
        out += _pieces_of_block(ggml_type, data[b * size:(b + 1) * size])
    return out


def dequantize(ggml_type: int, data: bytes, n: int) -> list[float]:
    """n values from a row (or rows) of blocks, exactly (in double precision)."""
    if ggml_type == GGML_F32:
        return list(array("f", data[:4 * n]))
    if ggml_type == GGML_F16:
        return [f16_value(h) for h in struct.unpack(f"<{n}H", data[:2 * n])]
    if ggml_type == GGML_BF16:
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack(f"<{n}H", data[:2 * n])]
    return [d * scale[i // 16] * q[i] + minimum[i // 16]
            for d, scale, minimum, q in pieces(ggml_type, data, n) for i in range(QK)]


def random_blocks(ggml_type: int, n: int, rng: random.Random, std: float = 1.0) -> bytes:
    """n elements of random blocks whose values spread about ±std: random quant bits
    and scales, the f16 super-scales (and MXFP4 exponent) chosen for the spread."""
    elems, size = TYPE_LAYOUT[ggml_type]
    if elems == 1:
        return encode_tensor(ggml_type, [rng.gauss(0.0, std) for _ in range(n)])
    # The typical |scale * q| of each type's random bits, which d divides out.
    typical = {GGML_Q4_0: 4, GGML_Q4_1: 8, GGML_Q5_0: 8, GGML_Q5_1: 16, GGML_Q8_0: 64, GGML_IQ4_NL: 60,
               GGML_MXFP4: 5, GGML_Q2_K: 12, GGML_Q3_K: 40, GGML_Q4_K: 256, GGML_Q5_K: 512, GGML_Q6_K: 1024,
               GGML_IQ4_XS: 900}[ggml_type]
    d = f16_bits(std / typical)
    out = bytearray()
    for _ in range(n // elems):
        blk = bytearray(rng.randbytes(size))
        if ggml_type == GGML_MXFP4:
            blk[0] = max(0, min(254, 128 + round(math.log2(std / typical))))
        elif ggml_type in (GGML_Q2_K, GGML_Q3_K, GGML_Q6_K):
            struct.pack_into("<H", blk, size - 2 - (2 if ggml_type == GGML_Q2_K else 0), d)
            if ggml_type == GGML_Q2_K:
                struct.pack_into("<H", blk, size - 2, f16_bits(std / typical / 4))  # small mins
        elif ggml_type in (GGML_Q4_K, GGML_Q5_K):
            struct.pack_into("<HH", blk, 0, d, f16_bits(std / typical / 4))
        elif ggml_type in (GGML_Q4_1, GGML_Q5_1):
            struct.pack_into("<HH", blk, 0, d, f16_bits(-std / 2))
        else:
            struct.pack_into("<H", blk, 0, d)
        out += blk
    return bytes(out)


def encode_tensor(ggml_type: int, values) -> bytes:
    """Row-major values (rows a whole number of blocks) in ggml_type."""
    if ggml_type == GGML_BF16:  # rounded to nearest even, as llama.cpp converts
        bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]
        return struct.pack(f"<{len(bits)}H", *((b + 0x7FFF + ((b >> 16) & 1)) >> 16 for b in bits))
    return {GGML_F32: encode_f32, GGML_F16: encode_f16, GGML_Q8_0: quantize_q8_0,
            GGML_Q4_0: quantize_q4_0, GGML_Q4_1: quantize_q4_1}[ggml_type](values)


# ---- a byte-level BPE vocabulary -------------------------------------------------

def gpt2_byte_chars() -> list[str]:
    """The GPT-2 printable character standing for each byte 0..255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


_CORPUS = (
    "the quick brown fox jumps over the lazy dog. hello world, hello there! "
    "in the beginning the model reads the text and then it writes the answer. "
    "tokens are pieces of words; the tokenizer merges the most frequent pairs first. "
    "we test the engine with tiny models that load in milliseconds and never crash. "
    "once upon a time there was a little server that answered every request quickly."
)

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Qwen2.5-Coder's fill-in-the-middle markers, in its order
FIM_MARKERS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


def name_last_tokens(w: GGUFWriter, names: Sequence[str] = FIM_MARKERS) -> int:
    """Rename the last len(names) tokens of w's vocabulary (build with at least that
    many reserved control tokens) to names; returns the first one's id."""
    tokens = list(w.get("tokenizer.ggml.tokens").value[1])
    first = len(tokens) - len(names)
    tokens[first:] = names
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    return first


# Qwen3-Reranker's prompt, as llama.cpp's converter writes it into the GGUF.
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: "
    "Given a web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: "
    "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def make_reranker(w: GGUFWriter, n_embd: int, rng: random.Random, *, head: bool = True,
                  template: bool = True) -> None:
    """Make w's qwen3 model a reranker as llama.cpp converts Qwen3-Reranker: rank
    pooling; with `head`, a classifier head of the labels "yes" and "no" (random F32
    rows, where the converter copies the output head's rows of those two tokens); with
    `template`, the rerank prompt."""
    w.set("qwen3.pooling_type", U32, 4)
    if head:
        w.set("qwen3.classifier.output_labels", ARRAY, (STRING, ["yes", "no"]))
        w.add_tensor("cls.output.weight", [n_embd, 2], GGML_F32,
                     encode_f32([rng.gauss(0.0, 0.3) for _ in range(2 * n_embd)]))
    if template:
        w.set("tokenizer.chat_template.rerank", STRING, QWEN3_RERANK_TEMPLATE)


def bpe_vocab(n_merged: int) -> tuple[list[str], list[str]]:
    """(tokens, merges): 256 byte characters then n_merged merged tokens, with
    merges learned greedily (most frequent pair first) from a fixed English text."""
    byte_chars = gpt2_byte_chars()
    words = []
    for i, w in enumerate(_CORPUS.split(" ")):
        text = (" " + w if i else w).encode()
        words.append([byte_chars[b] for b in text])
    tokens = list(byte_chars)
    known = set(tokens)
    merges: list[str] = []
    while len(tokens) < 256 + n_merged:
        counts: dict[tuple[str, str], int] = {}
        for w in words:
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], p))  # ties broken deterministically
        joined = pair[0] + pair[1]
        merges.append(f"{pair[0]} {pair[1]}")
        if joined not in known:
            known.add(joined)
            tokens.append(joined)
        for w in words:
            i = 0
            while i + 1 < len(w):
                if (w[i], w[i + 1]) == pair:
                    w[i:i + 2] = [joined]
                i += 1
    # Text ran out of pairs: join letters pairwise until the vocabulary is full.
    letters = [byte_chars[b] for b in b"abcdefghijklmnopqrstuvwxyz"]
    for a in letters:
        for b in letters:
            if len(tokens) >= 256 + n_merged:
                return tokens, merges
            if a + b not in known:
                known.add(a + b)
                tokens.append(a + b)
                merges.append(f"{a} {b}")
    return tokens, merges


# ---- a tiny llama model -----------------------------------------------------------

ARCHS = ("llama", "mistral3", "phi3", "qwen2", "qwen3", "qwen3moe", "smollm3")
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 8, 2, 32  # qwen3moe's experts  # the families build_tiny_llama writes


@dataclass(frozen=True)
class TinyLlama:
    """What write_tiny_llama() wrote, for tests to check the engine against."""
    path: Path
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int
    weight_type: int
    tokens: tuple[str, ...]
    endoftext_id: int
    im_start_id: int
    im_end_id: int
    bos_id: int
    eos_id: int
    chat_template: str
    name: str
    pre: str
    weight_bytes: int  # sum of tensor data sizes (padding excluded)
    arch: str = "llama"
    head_dim: int = 0  # 0: n_embd // n_head

    @property
    def kv_dim(self) -> int:
        return (self.head_dim or self.n_embd // self.n_head) * self.n_head_kv

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.n_layer * self.kv_dim * 2  # K and V, f16


def build_tiny_llama(*, n_vocab: int = 300, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 128,
                     weight_type: int = GGML_F32, seed: int = 1, tied: bool = True,
                     pre: str = "smollm", name: str = "tiny-llama",
                     chat_template: str = CHATML_TEMPLATE, alignment: int | None = 32,
                     extra_metadata: list[tuple[str, int, object]] = (),
                     attn_bias: bool = False, arch: str = "llama",
                     head_dim: int | None = None, reserved: int = 0, random_matrix=None,
                     experts: bool = False) -> GGUFWriter:
    """A GGUFWriter holding a complete random-weight model (edit it, then write) of
    `arch`, laid out as llama.cpp names it:
      llama    with `attn_bias`, q/k/v/output projections carry biases; with `experts`,
               Mixtral's layout: N_EXPERT SwiGLU experts of n_ff in place of the FFN,
               N_EXPERT_USED routed per token;
      qwen2    q/k/v biases;
      qwen3    RMS norms over each query and key head (attn_q_norm, attn_k_norm);
      smollm3  the llama layout (the engine skips RoPE on every 4th layer);
      mistral3 the llama layout;
      phi3     fused attn_qkv and ffn_up (gate rows first), RoPE over 3/4 of each head;
      qwen3moe qwen3's attention, and N_EXPERT SwiGLU experts of N_FF_EXP, N_EXPERT_USED
               routed per token.
    `head_dim` sets attention.key_length (default n_embd // n_head). At least `reserved`
    control tokens <|reserved_N|> pad the vocabulary (as Llama 3's do) to n_vocab past
    what the BPE merges fill; random_matrix(cols, rows, std, rng) -> bytes of weight_type
    replaces the writer's Gaussian weights (for big models)."""
    assert arch in ARCHS, arch
    assert n_vocab >= 256 + len(CONTROL_TOKENS) + reserved, "the 256 byte tokens and the controls must fit"
    rng = random.Random(seed)
    tokens, merges = bpe_vocab(n_vocab - 256 - len(CONTROL_TOKENS) - reserved)
    # The merges learned from the text may fall short: reserved tokens fill the rest.
    n_reserved = n_vocab - len(tokens) - len(CONTROL_TOKENS) if reserved else 0
    controls = list(CONTROL_TOKENS) + [f"<|reserved_{i}|>" for i in range(n_reserved)]
    tokens += controls
    types = [1] * (len(tokens) - len(controls)) + [3] * len(controls)
    ids = {t: tokens.index(t) for t in CONTROL_TOKENS}

    w = GGUFWriter()
    w.set("general.architecture", STRING, arch)
    w.set("general.name", STRING, name)
    if alignment is not None:
        w.set("general.alignment", U32, alignment)
    w.set("general.file_type", U32, FILE_TYPES[weight_type])
    head_dim = head_dim or n_embd // n_head
    w.set(f"{arch}.vocab_size", U32, n_vocab)
    w.set(f"{arch}.context_length", U32, n_ctx)
    w.set(f"{arch}.embedding_length", U32, n_embd)
    w.set(f"{arch}.block_count", U32, n_layer)
    w.set(f"{arch}.feed_forward_length", U32, n_ff)
    w.set(f"{arch}.attention.head_count", U32, n_head)
    w.set(f"{arch}.attention.head_count_kv", U32, n_head_kv)
    if head_dim != n_embd // n_head:
        w.set(f"{arch}.attention.key_length", U32, head_dim)
        w.set(f"{arch}.attention.value_length", U32, head_dim)
    # Phi-3 rotates only part of each head (Phi-4-mini: 3/4 of it).
    w.set(f"{arch}.rope.dimension_count", U32, head_dim * 3 // 8 * 2 if arch == "phi3" else head_dim)
    w.set(f"{arch}.rope.freq_base", F32, 10000.0)
    w.set(f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-5)
    assert not experts or arch == "llama", "experts: the llama layout (qwen3moe has its own)"
    moe = arch == "qwen3moe" or experts
    n_ff_exp = N_FF_EXP if arch == "qwen3moe" else n_ff
    if moe:
        w.set(f"{arch}.expert_count", U32, N_EXPERT)
        w.set(f"{arch}.expert_used_count", U32, N_EXPERT_USED)
    if arch == "qwen3moe":
        w.set(f"{arch}.expert_feed_forward_length", U32, N_FF_EXP)
    w.set("tokenizer.ggml.model", STRING, "gpt2")
    w.set("tokenizer.ggml.pre", STRING, pre)
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    w.set("tokenizer.ggml.token_type", ARRAY, (I32, types))
    w.set("tokenizer.ggml.merges", ARRAY, (STRING, merges))
    w.set("tokenizer.ggml.bos_token_id", U32, ids["<|im_start|>"])
    w.set("tokenizer.ggml.eos_token_id", U32, ids["<|im_end|>"])
    w.set("tokenizer.ggml.padding_token_id", U32, ids["<|endoftext|>"])
    w.set("tokenizer.ggml.add_bos_token", BOOL, False)
    w.set("tokenizer.chat_template", STRING, chat_template)
    for key, vtype, value in extra_metadata:
        w.set(key, vtype, value)

    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim

    def matrix(name: str, cols: int, rows: int, std: float) -> None:
        if random_matrix is not None:
            data = random_matrix(cols, rows, std, rng)
        elif weight_type in (GGML_F32, GGML_F16, GGML_BF16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0):
            data = encode_tensor(weight_type, [rng.gauss(0.0, std) for _ in range(cols * rows)])
        else:  # the writer has no quantizer for the type: random blocks of the same spread
            data = random_blocks(weight_type, cols * rows, rng, std)
        w.add_tensor(name, [cols, rows], weight_type, data)

    def norm(name: str) -> None:
        values = [1.0 + rng.uniform(-0.1, 0.1) for _ in range(n_embd)]
        w.add_tensor(name, [n_embd], GGML_F32, encode_f32(values))

    def bias(name: str, n: int) -> None:
        w.add_tensor(name, [n], GGML_F32, encode_f32([rng.gauss(0.0, 0.5) for _ in range(n)]))

    def head_norm(name: str) -> None:
        w.add_tensor(name, [head_dim], GGML_F32, encode_f32([1.0 + rng.uniform(-0.3, 0.3) for _ in range(head_dim)]))

    # Small embeddings and strong residual writes keep a tied model from simply
    # repeating its input token: greedy output then varies from step to step.
    matrix("token_embd.weight", n_embd, n_vocab, 0.3)
    norm("output_norm.weight")
    if not tied:
        matrix("output.weight", n_embd, n_vocab, 0.3)
    for layer in range(n_layer):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        if arch == "phi3":  # q, k, v rows in one matrix
            matrix(blk + "attn_qkv.weight", n_embd, q_dim + 2 * kv_dim, 1.0 / math.sqrt(n_embd))
        else:
            matrix(blk + "attn_q.weight", n_embd, q_dim, 1.0 / math.sqrt(n_embd))
            matrix(blk + "attn_k.weight", n_embd, kv_dim, 1.0 / math.sqrt(n_embd))
            matrix(blk + "attn_v.weight", n_embd, kv_dim, 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_output.weight", q_dim, n_embd, 2.0 / math.sqrt(q_dim))
        if attn_bias or arch == "qwen2":
            bias(blk + "attn_q.bias", q_dim)
            bias(blk + "attn_k.bias", kv_dim)
            bias(blk + "attn_v.bias", kv_dim)
        if attn_bias and arch == "llama":
            bias(blk + "attn_output.bias", n_embd)
        if arch in ("qwen3", "qwen3moe"):
            head_norm(blk + "attn_q_norm.weight")
            head_norm(blk + "attn_k_norm.weight")
        norm(blk + "ffn_norm.weight")
        if moe:
            # The router stays F32, as llama-quantize leaves it.
            router = [rng.gauss(0.0, 1.0) for _ in range(n_embd * N_EXPERT)]
            w.add_tensor(blk + "ffn_gate_inp.weight", [n_embd, N_EXPERT], GGML_F32, encode_f32(router))
            for part, cols, rows, std in (("gate", n_embd, n_ff_exp, 1.0 / math.sqrt(n_embd)),
                                          ("up", n_embd, n_ff_exp, 1.0 / math.sqrt(n_embd)),
                                          ("down", n_ff_exp, n_embd, 2.0 / math.sqrt(n_ff_exp))):
                values = [rng.gauss(0.0, std) for _ in range(cols * rows * N_EXPERT)]
                w.add_tensor(blk + f"ffn_{part}_exps.weight", [cols, rows, N_EXPERT], weight_type,
                             encode_tensor(weight_type, values))
            continue
        if arch == "phi3":  # gate rows, then up rows
            matrix(blk + "ffn_up.weight", n_embd, 2 * n_ff, 1.0 / math.sqrt(n_embd))
        else:
            matrix(blk + "ffn_gate.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_up.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down.weight", n_ff, n_embd, 2.0 / math.sqrt(n_ff))
    return w


def write_tiny_llama(path: str | Path, *, n_vocab: int = 300, n_embd: int = 64, n_layer: int = 2,
                     n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 128,
                     weight_type: int = GGML_F32, seed: int = 1, tied: bool = True,
                     pre: str = "smollm", name: str = "tiny-llama",
                     chat_template: str = CHATML_TEMPLATE, alignment: int | None = 32,
                     extra_metadata: list[tuple[str, int, object]] = (),
                     attn_bias: bool = False, arch: str = "llama",
                     head_dim: int | None = None) -> TinyLlama:
    """Writes a random-weight GGUF of `arch` (build_tiny_llama) with a valid byte-level
    BPE vocabulary:
    ids 0..255 are the GPT-2 byte characters, then merged tokens, then
    <|endoftext|>, <|im_start|>, <|im_end|> (token type 3). eos = <|im_end|>,
    bos = <|im_start|> (not added to prompts)."""
    w = build_tiny_llama(n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                         n_head_kv=n_head_kv, n_ff=n_ff, n_ctx=n_ctx, weight_type=weight_type,
                         seed=seed, tied=tied, pre=pre, name=name, chat_template=chat_template,
                         alignment=alignment, extra_metadata=extra_metadata, attn_bias=attn_bias,
                         arch=arch, head_dim=head_dim)
    path = w.write(path)
    tokens = tuple(w.get("tokenizer.ggml.tokens").value[1])
    return TinyLlama(
        path=path, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
        n_head_kv=n_head_kv, n_ff=n_ff, n_ctx=n_ctx, weight_type=weight_type, tokens=tokens,
        endoftext_id=tokens.index("<|endoftext|>"), im_start_id=tokens.index("<|im_start|>"),
        im_end_id=tokens.index("<|im_end|>"), bos_id=tokens.index("<|im_start|>"),
        eos_id=tokens.index("<|im_end|>"), chat_template=chat_template, name=name, pre=pre,
        weight_bytes=sum(len(t.data) for t in w.tensors), arch=arch, head_dim=head_dim or 0)


def fuse_qkv(w: GGUFWriter) -> GGUFWriter:
    """w with every layer's attn_q, attn_k and attn_v weights stored as one attn_qkv
    (q's rows, then k's, then v's), as some converters write them, and their biases, where
    the layer has all three, as one attn_qkv.bias."""
    names = {t.name for t in w.tensors}
    for q in [t for t in w.tensors if t.name.endswith(".attn_q.weight")]:
        blk = q.name.removesuffix("attn_q.weight")
        parts = [w.tensor(f"{blk}attn_{x}.weight") for x in "qkv"]
        assert all(p.ggml_type == q.ggml_type and p.ne[0] == q.ne[0] for p in parts), blk
        w.add_tensor(blk + "attn_qkv.weight", [q.ne[0], sum(p.ne[1] for p in parts)], q.ggml_type,
                     b"".join(p.data for p in parts))
        biases = [f"{blk}attn_{x}.bias" for x in "qkv"]
        if all(b in names for b in biases):
            data = [w.tensor(b).data for b in biases]
            w.add_tensor(blk + "attn_qkv.bias", [sum(len(d) // 4 for d in data)], GGML_F32, b"".join(data))
            for b in biases:
                w.remove_tensor(b)
        for p in parts:
            w.remove_tensor(p.name)
    return w


# ---- a tiny gemma3 model ----------------------------------------------------------

def build_llama_base(arch: str, n_layer: int, **kwargs) -> GGUFWriter:
    """build_tiny_llama's tokenizer and shared keys (widths, heads, RoPE as it writes
    them from kwargs; block_count n_layer) with no layer tensors, under another
    architecture: its "llama." keys renamed "<arch>.", for that family's builder."""
    w = build_tiny_llama(n_layer=0, **kwargs)
    w.set("general.architecture", STRING, arch)
    w.set("llama.block_count", U32, n_layer)
    for kv in w.kvs:
        if kv.key.startswith("llama."):
            kv.key = arch + "." + kv.key[len("llama."):]
    return w


def build_tiny_gemma3(**options) -> GGUFWriter:
    """build_tiny_gemma's gemma3 model."""
    return build_tiny_gemma("gemma3", **options)


def build_tiny_gemma2(*, attn_softcap: float = 0.0, **options) -> GGUFWriter:
    """build_tiny_gemma's gemma2 model (no q/k head norms, the output tied to the
    embeddings as llama.cpp requires), attn_logit_softcapping when > 0."""
    w = build_tiny_gemma("gemma2", tied=True, **options)
    if attn_softcap:
        w.set("gemma2.attn_logit_softcapping", F32, attn_softcap)
    return w


def tensor_writers(w: GGUFWriter, rng: random.Random, weight_type: int, random_matrix, n_embd: int):
    """The Gemma and GLM builders' tensor writers, both drawing from rng: matrix(name,
    cols, rows, std, stack=1), weights of weight_type (from random_matrix where given,
    else Gaussian), a stack of `stack` matrices [cols, rows, stack] when above 1
    (experts); and norm(name, n=n_embd), F32 weights near 1 (Gemma's 1 + w folded in)."""
    def matrix(name: str, cols: int, rows: int, std: float, stack: int = 1) -> None:
        if random_matrix is not None:
            data = random_matrix(cols, rows * stack, std, rng)
        else:
            data = encode_tensor(weight_type, [rng.gauss(0.0, std) for _ in range(cols * rows * stack)])
        w.add_tensor(name, [cols, rows] + ([stack] if stack > 1 else []), weight_type, data)

    def norm(name: str, n: int = n_embd) -> None:
        w.add_tensor(name, [n], GGML_F32, encode_f32([1.0 + rng.uniform(-0.2, 0.2) for _ in range(n)]))

    return matrix, norm


def build_tiny_gemma(arch: str, *, n_embd: int = 64, n_layer: int = 6, n_head: int = 2, n_head_kv: int = 1,
                     head_dim: int = 256, n_ff: int = 128, n_ctx: int = 512, window: int = 32,
                     pattern: int | list[bool] | None = None, rope_base_local: float | None = None,
                     softcap: float = 0.0, weight_type: int = GGML_F32, seed: int = 1, tied: bool = False,
                     n_vocab: int = 300, reserved: int = 0, random_matrix=None) -> GGUFWriter:
    """A GGUFWriter holding a random-weight gemma3 (or gemma2, or gemma) model laid out
    as llama.cpp's converter writes one, with build_tiny_llama's tokenizer: heads of
    head_dim (256 as Gemma 3's), sliding-window layers by `pattern` (a period, or a
    bool per layer; None leaves the key out: the family's period) over `window`
    positions (0: no window key), rope.freq_base_swa only when given,
    final_logit_softcapping when > 0, q/k head norms in gemma3, no post norms in gemma.
    Norm weights are stored as the converter stores them, with Gemma's 1 + w folded in.
    n_vocab, reserved and random_matrix as build_tiny_llama takes them."""
    w = build_llama_base(arch, n_layer, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                         head_dim=head_dim, n_ff=n_ff, n_ctx=n_ctx, weight_type=weight_type,
                         name=f"tiny-{arch}", reserved=reserved, random_matrix=random_matrix)
    w.set(f"{arch}.attention.key_length", U32, head_dim)  # even where it is n_embd / n_head
    w.set(f"{arch}.attention.value_length", U32, head_dim)
    w.set(f"{arch}.rope.freq_base", F32, 1000000.0)
    w.set(f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-6)
    if window:
        w.set(f"{arch}.attention.sliding_window", U32, window)
    if isinstance(pattern, int):
        w.set(f"{arch}.attention.sliding_window_pattern", U32, pattern)
    elif pattern is not None:
        w.set(f"{arch}.attention.sliding_window_pattern", ARRAY, (BOOL, pattern))
    if rope_base_local is not None:
        w.set(f"{arch}.rope.freq_base_swa", F32, rope_base_local)
    if softcap:
        w.set(f"{arch}.final_logit_softcapping", F32, softcap)

    rng = random.Random(seed)
    n_vocab = w.get(f"{arch}.vocab_size").value
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    w.tensors = []

    matrix, norm = tensor_writers(w, rng, weight_type, random_matrix, n_embd)

    # Embeddings are scaled by √n_embd on the way in: small ones enter at about the
    # scale of the norms' output, and a separate output head keeps the logits varied.
    matrix("token_embd.weight", n_embd, n_vocab, 1.0 / math.sqrt(n_embd))
    norm("output_norm.weight")
    if not tied:
        matrix("output.weight", n_embd, n_vocab, 0.3)
    for layer in range(n_layer):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        matrix(blk + "attn_q.weight", n_embd, q_dim, 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_k.weight", n_embd, kv_dim, 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_v.weight", n_embd, kv_dim, 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_output.weight", q_dim, n_embd, 2.0 / math.sqrt(q_dim))
        if arch == "gemma3":
            norm(blk + "attn_q_norm.weight", head_dim)
            norm(blk + "attn_k_norm.weight", head_dim)
        if arch != "gemma":
            norm(blk + "post_attention_norm.weight")
        norm(blk + "ffn_norm.weight")
        matrix(blk + "ffn_gate.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down.weight", n_ff, n_embd, 2.0 / math.sqrt(n_ff))
        if arch != "gemma":
            norm(blk + "post_ffw_norm.weight")
    return w


def build_tiny_gemma4(*, n_embd: int = 64, n_head: int = 2, local: tuple[bool, ...] = (True, True, False) * 2,
                      kv_heads: tuple[int, int] = (2, 1), head_dims: tuple[int, int] = (64, 128),
                      rope_local: int | None = None, turned: int = 4, n_ff: int = 128, shared: int = 3,
                      wide_shared: bool = True, per_layer: int = 16, values: bool = False,
                      shared_weights: bool = False, out_scales: bool = True, softcap: float | None = None,
                      n_expert: int = 0, n_expert_used: int = 2, n_ff_exp: int = 32, fused_experts: bool = False,
                      expert_scales: bool = False, n_ctx: int = 512, window: int = 32, weight_type: int = GGML_F32,
                      seed: int = 1, n_vocab: int = 300, reserved: int = 0, random_matrix=None) -> GGUFWriter:
    """A GGUFWriter holding a random-weight gemma4 model laid out as llama.cpp's
    converter writes one, with build_tiny_llama's tokenizer: layers local or global by
    `local`; (local, global) KV heads `kv_heads` and head widths `head_dims`; the local
    layers turning rope_local dims (all when None), the global ones `turned` pairs of
    theirs (rope_freqs: the others' factors 1e30); the last `shared` layers reading
    earlier layers' caches, with FFNs twice as wide (`wide_shared`) and, with
    shared_weights, the k/v weights the converter keeps for them anyway; per-layer inputs
    of `per_layer` floats (0: none); global layers without attn_v unless `values`;
    layer_output_scale when out_scales; final_logit_softcapping when given (30 when
    absent, as llama.cpp reads it). With n_expert, every layer also has n_expert
    GELU-gated experts of n_ff_exp (as 26B-A4B), n_expert_used per token, their router
    with its input scale (ffn_gate_inp.scale) and their norms; gate and up in one
    ffn_gate_up_exps stack with fused_experts; a scale per expert of the down
    projections (ffn_down_exps.scale) with expert_scales. The output head is the
    embeddings'. n_vocab, reserved and random_matrix as build_tiny_llama takes them."""
    arch, n_layer = "gemma4", len(local)
    w = build_llama_base(arch, n_layer, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head, n_head_kv=max(kv_heads),
                         head_dim=head_dims[1], n_ff=n_ff, n_ctx=n_ctx, weight_type=weight_type, name="tiny-gemma4",
                         reserved=reserved, random_matrix=random_matrix)
    first_shared = n_layer - shared
    ffs = [n_ff * (2 if wide_shared and l >= first_shared else 1) for l in range(n_layer)]
    layer_kv = [kv_heads[0] if loc else kv_heads[1] for loc in local]
    w.set(f"{arch}.attention.head_count_kv", ARRAY, (I32, layer_kv))
    w.set(f"{arch}.feed_forward_length", ARRAY, (I32, ffs))
    w.set(f"{arch}.attention.key_length", U32, head_dims[1])
    w.set(f"{arch}.attention.value_length", U32, head_dims[1])
    w.set(f"{arch}.attention.key_length_swa", U32, head_dims[0])
    w.set(f"{arch}.attention.value_length_swa", U32, head_dims[0])
    w.set(f"{arch}.rope.dimension_count", U32, head_dims[1])
    w.set(f"{arch}.rope.dimension_count_swa", U32, rope_local or head_dims[0])
    w.set(f"{arch}.rope.freq_base", F32, 1000000.0)
    w.set(f"{arch}.rope.freq_base_swa", F32, 10000.0)
    w.set(f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-6)
    w.set(f"{arch}.attention.sliding_window", U32, window)
    w.set(f"{arch}.attention.sliding_window_pattern", ARRAY, (BOOL, list(local)))
    w.set(f"{arch}.attention.shared_kv_layers", U32, shared)
    w.set(f"{arch}.embedding_length_per_layer_input", U32, per_layer)
    if softcap is not None:
        w.set(f"{arch}.final_logit_softcapping", F32, softcap)
    if n_expert:
        w.set(f"{arch}.expert_count", U32, n_expert)
        w.set(f"{arch}.expert_used_count", U32, n_expert_used)
        w.set(f"{arch}.expert_feed_forward_length", U32, n_ff_exp)

    rng = random.Random(seed)
    n_vocab = w.get(f"{arch}.vocab_size").value
    w.tensors = []

    matrix, norm = tensor_writers(w, rng, weight_type, random_matrix, n_embd)

    matrix("token_embd.weight", n_embd, n_vocab, 1.0 / math.sqrt(n_embd))
    norm("output_norm.weight")
    half = head_dims[1] // 2
    w.add_tensor("rope_freqs.weight", [half], GGML_F32, encode_f32([1.0] * turned + [1e30] * (half - turned)))
    if per_layer:
        matrix("per_layer_token_embd.weight", per_layer * n_layer, n_vocab, 1.0)
        matrix("per_layer_model_proj.weight", n_embd, per_layer * n_layer, 1.0 / math.sqrt(n_embd))
        norm("per_layer_proj_norm.weight", per_layer)
    for layer, loc in enumerate(local):
        blk = f"blk.{layer}."
        hd, n_kv = head_dims[0 if loc else 1], layer_kv[layer]
        norm(blk + "attn_norm.weight")
        matrix(blk + "attn_q.weight", n_embd, n_head * hd, 1.0 / math.sqrt(n_embd))
        norm(blk + "attn_q_norm.weight", hd)
        if layer < first_shared or shared_weights:
            matrix(blk + "attn_k.weight", n_embd, n_kv * hd, 1.0 / math.sqrt(n_embd))
            if loc or values:
                matrix(blk + "attn_v.weight", n_embd, n_kv * hd, 1.0 / math.sqrt(n_embd))
            norm(blk + "attn_k_norm.weight", hd)
        matrix(blk + "attn_output.weight", n_head * hd, n_embd, 2.0 / math.sqrt(n_head * hd))
        norm(blk + "post_attention_norm.weight")
        norm(blk + "ffn_norm.weight")
        matrix(blk + "ffn_gate.weight", n_embd, ffs[layer], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up.weight", n_embd, ffs[layer], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down.weight", ffs[layer], n_embd, 2.0 / math.sqrt(ffs[layer]))
        norm(blk + "post_ffw_norm.weight")
        if n_expert:
            matrix(blk + "ffn_gate_inp.weight", n_embd, n_expert, 1.0)
            norm(blk + "ffn_gate_inp.scale")
            norm(blk + "pre_ffw_norm_2.weight")
            norm(blk + "post_ffw_norm_1.weight")
            norm(blk + "post_ffw_norm_2.weight")
            if fused_experts:
                matrix(blk + "ffn_gate_up_exps.weight", n_embd, 2 * n_ff_exp, 1.0 / math.sqrt(n_embd), n_expert)
            else:
                matrix(blk + "ffn_gate_exps.weight", n_embd, n_ff_exp, 1.0 / math.sqrt(n_embd), n_expert)
                matrix(blk + "ffn_up_exps.weight", n_embd, n_ff_exp, 1.0 / math.sqrt(n_embd), n_expert)
            matrix(blk + "ffn_down_exps.weight", n_ff_exp, n_embd, 2.0 / math.sqrt(n_ff_exp), n_expert)
            if expert_scales:
                w.add_tensor(blk + "ffn_down_exps.scale", [n_expert], GGML_F32,
                             encode_f32([rng.uniform(0.5, 2.0) for _ in range(n_expert)]))
        if per_layer:
            matrix(blk + "inp_gate.weight", n_embd, per_layer, 1.0 / math.sqrt(n_embd))
            matrix(blk + "proj.weight", per_layer, n_embd, 1.0 / math.sqrt(per_layer))
            norm(blk + "post_norm.weight")
        if out_scales:
            w.add_tensor(blk + "layer_output_scale.weight", [1], GGML_F32, encode_f32([rng.uniform(0.5, 1.5)]))
    return w


# ---- a tiny Cohere 2 model ---------------------------------------------------------

def build_tiny_cohere2(*, n_embd: int = 64, n_layer: int = 8, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 96,
                       window: int = 16, logit_scale: float = 0.25, biases: bool = False, n_ctx: int = 128,
                       weight_type: int = GGML_F32, seed: int = 1) -> GGUFWriter:
    """A GGUFWriter holding a random-weight cohere2 model (Command R7B) laid out as
    llama.cpp's converter writes one, with build_tiny_llama's tokenizer: LayerNorm
    weights (attn_norm, output_norm), q/k/v (with biases when `biases`) and output, a
    SwiGLU FFN, three layers of four over a sliding `window` (no pattern key: the
    family's period), logit_scale; the output head is the embeddings'."""
    arch = "cohere2"
    w = build_llama_base(arch, n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_ctx=n_ctx,
                         weight_type=weight_type, name="tiny-cohere2")
    w.set(f"{arch}.attention.layer_norm_epsilon", F32, 1e-5)
    w.set(f"{arch}.attention.sliding_window", U32, window)
    w.set(f"{arch}.logit_scale", F32, logit_scale)
    rng = random.Random(seed)
    n_vocab = w.get(f"{arch}.vocab_size").value
    w.tensors = []
    matrix, norm = tensor_writers(w, rng, weight_type, None, n_embd)

    def bias(name: str, n: int) -> None:
        w.add_tensor(name, [n], GGML_F32, encode_f32([rng.gauss(0.0, 0.2) for _ in range(n)]))

    matrix("token_embd.weight", n_embd, n_vocab, 4.0 / math.sqrt(n_embd))  # the head's too: logits of std ~1
    norm("output_norm.weight")
    head_dim = n_embd // n_head
    for layer in range(n_layer):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        for part, rows in (("q", n_head * head_dim), ("k", n_head_kv * head_dim), ("v", n_head_kv * head_dim)):
            matrix(blk + f"attn_{part}.weight", n_embd, rows, 1.0 / math.sqrt(n_embd))
            if biases:
                bias(blk + f"attn_{part}.bias", rows)
        matrix(blk + "attn_output.weight", n_head * head_dim, n_embd, 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_gate.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down.weight", n_ff, n_embd, 1.0 / math.sqrt(n_ff))
    return w


# ---- tiny GLM-4 models ------------------------------------------------------------

def build_tiny_glm4(*, arch: str = "glm4", n_embd: int = 64, n_layer: int = 3, n_head: int = 4, n_head_kv: int = 2,
                    head_dim: int = 32, rope_dim: int = 16, n_ff: int = 96, sections: tuple[int, ...] | None = None,
                    fused_qkv: bool = False, n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 32,
                    n_shared: int = 1, lead: int = 1, qk_norm: bool = False, norm_weights: bool = True,
                    scale: float | None = None, nextn: int = 0, n_ctx: int = 512, weight_type: int = GGML_F32,
                    seed: int = 1, n_vocab: int = 300, reserved: int = 0, random_matrix=None) -> GGUFWriter:
    """A GGUFWriter holding a random-weight glm4 (or glm4moe) model laid out as
    llama.cpp's converter writes one, with build_tiny_llama's tokenizer: q/k/v with
    biases (one attn_qkv with its bias when fused_qkv), RoPE over rope_dim dims of each
    head, rope.dimension_sections when given; `nextn` multi-token-prediction blocks
    after the layers; the output head untied. glm4: post-attention and post-FFN norms,
    gate and up in one ffn_up (gate rows first). glm4moe: the FFN normed by
    post_attention_norm; the first `lead` layers dense, the others n_expert SwiGLU
    experts of n_ff_exp (n_expert_used per token, a selection bias exp_probs_b) plus
    n_shared shared ones as one; q/k head norms with qk_norm; expert_weights_norm as
    norm_weights and expert_weights_scale when given. n_vocab, reserved and
    random_matrix as build_tiny_llama takes them."""
    w = build_llama_base(arch, n_layer + nextn, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                         head_dim=head_dim, n_ff=n_ff, n_ctx=n_ctx, weight_type=weight_type, name="tiny-" + arch,
                         reserved=reserved, random_matrix=random_matrix)
    w.set(f"{arch}.rope.dimension_count", U32, rope_dim)
    w.set(f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-5)
    if sections is not None:
        w.set(f"{arch}.rope.dimension_sections", ARRAY, (I32, list(sections)))
    if nextn:
        w.set(f"{arch}.nextn_predict_layers", U32, nextn)
    moe = arch == "glm4moe"
    if moe:
        w.set(f"{arch}.expert_count", U32, n_expert)
        w.set(f"{arch}.expert_used_count", U32, n_expert_used)
        w.set(f"{arch}.expert_feed_forward_length", U32, n_ff_exp)
        w.set(f"{arch}.expert_shared_count", U32, n_shared)
        w.set(f"{arch}.leading_dense_block_count", U32, lead)
        w.set(f"{arch}.expert_weights_norm", BOOL, norm_weights)
        w.set(f"{arch}.expert_gating_func", U32, 2)  # sigmoid, as the converter writes it
        if scale is not None:
            w.set(f"{arch}.expert_weights_scale", F32, scale)
    rng = random.Random(seed)
    n_vocab = w.get(f"{arch}.vocab_size").value
    w.tensors = []
    matrix, norm = tensor_writers(w, rng, weight_type, random_matrix, n_embd)

    def vector(name: str, n: int, std: float) -> None:
        w.add_tensor(name, [n], GGML_F32, encode_f32([rng.gauss(0.0, std) for _ in range(n)]))

    matrix("token_embd.weight", n_embd, n_vocab, 1.0)
    norm("output_norm.weight")
    matrix("output.weight", n_embd, n_vocab, 1.0 / math.sqrt(n_embd))
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    for layer in range(n_layer + nextn):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        if fused_qkv:
            matrix(blk + "attn_qkv.weight", n_embd, q_dim + 2 * kv_dim, 1.0 / math.sqrt(n_embd))
            vector(blk + "attn_qkv.bias", q_dim + 2 * kv_dim, 0.5)
        else:
            for part, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                matrix(blk + f"attn_{part}.weight", n_embd, rows, 1.0 / math.sqrt(n_embd))
                vector(blk + f"attn_{part}.bias", rows, 0.5)
        if qk_norm:
            norm(blk + "attn_q_norm.weight", head_dim)
            norm(blk + "attn_k_norm.weight", head_dim)
        matrix(blk + "attn_output.weight", q_dim, n_embd, 2.0 / math.sqrt(q_dim))
        norm(blk + "post_attention_norm.weight")
        if not moe:
            norm(blk + "ffn_norm.weight")
            matrix(blk + "ffn_up.weight", n_embd, 2 * n_ff, 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_down.weight", n_ff, n_embd, 2.0 / math.sqrt(n_ff))
            norm(blk + "post_ffw_norm.weight")
        elif layer < lead:
            matrix(blk + "ffn_gate.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_up.weight", n_embd, n_ff, 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_down.weight", n_ff, n_embd, 2.0 / math.sqrt(n_ff))
        else:
            matrix(blk + "ffn_gate_inp.weight", n_embd, n_expert, 1.0 / math.sqrt(n_embd))
            vector(blk + "exp_probs_b.bias", n_expert, 0.2)
            matrix(blk + "ffn_gate_exps.weight", n_embd, n_ff_exp, 1.0 / math.sqrt(n_embd), n_expert)
            matrix(blk + "ffn_up_exps.weight", n_embd, n_ff_exp, 1.0 / math.sqrt(n_embd), n_expert)
            matrix(blk + "ffn_down_exps.weight", n_ff_exp, n_embd, 2.0 / math.sqrt(n_ff_exp), n_expert)
            if n_shared:
                width = n_shared * n_ff_exp
                matrix(blk + "ffn_gate_shexp.weight", n_embd, width, 1.0 / math.sqrt(n_embd))
                matrix(blk + "ffn_up_shexp.weight", n_embd, width, 1.0 / math.sqrt(n_embd))
                matrix(blk + "ffn_down_shexp.weight", width, n_embd, 2.0 / math.sqrt(width))
        if layer >= n_layer:
            matrix(blk + "nextn.eh_proj.weight", 2 * n_embd, n_embd, 1.0 / math.sqrt(2 * n_embd))
            norm(blk + "nextn.enorm.weight")
            norm(blk + "nextn.hnorm.weight")
            norm(blk + "nextn.shared_head_norm.weight")
    return w


# ---- tiny Nemotron-H models --------------------------------------------------------

def build_tiny_nemotron_h(*, pattern: str = "M*-M-*M-", n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                          n_ff: int = 96, conv_len: int = 4, ssm_heads: int = 4, ssm_head_dim: int = 32,
                          groups: int = 2, d_state: int = 16, biases: bool = True, n_expert: int = 0,
                          n_expert_used: int = 2, n_ff_exp: int = 32, n_ff_shexp: int = 48,
                          norm_weights: bool = True, scale: float | None = None, n_ctx: int = 128,
                          weight_type: int = GGML_F32, seed: int = 1) -> GGUFWriter:
    """A GGUFWriter holding a random-weight nemotron_h model (nemotron_h_moe with
    n_expert) laid out as llama.cpp's converter writes one, with build_tiny_llama's
    tokenizer: a layer per character of `pattern`, as NVIDIA's hybrid_override_pattern
    names them: "M" a Mamba-2 block (ssm_heads heads of ssm_head_dim, B and C in `groups`
    groups of d_state, a convolution over conv_len positions with its bias), "*"
    attention of n_head / n_head_kv heads (q/k/v and output biases with `biases`), "-"
    a feed-forward layer: up and down of n_ff (with biases), or n_expert experts of
    n_ff_exp, n_expert_used per token, with a selection bias, and a shared expert of
    n_ff_shexp; expert_weights_norm as norm_weights, expert_weights_scale when given.
    The output head is untied."""
    arch, n_layer = ("nemotron_h_moe" if n_expert else "nemotron_h"), len(pattern)
    inner = ssm_heads * ssm_head_dim
    w = build_llama_base(arch, n_layer, n_embd=n_embd, n_head=n_head, n_ff=n_ff, n_ctx=n_ctx,
                         weight_type=weight_type, name="tiny-" + arch)
    a = arch + "."
    w.set(a + "attention.head_count_kv", ARRAY, (I32, [n_head_kv if c == "*" else 0 for c in pattern]))
    w.set(a + "feed_forward_length", ARRAY, (I32, [n_ff if c == "-" else 0 for c in pattern]))
    w.set(a + "attention.layer_norm_epsilon", F32, 1e-5)
    w.set(a + "attention.layer_norm_rms_epsilon", F32, 1e-5)
    w.set(a + "ssm.conv_kernel", U32, conv_len)
    w.set(a + "ssm.inner_size", U32, inner)
    w.set(a + "ssm.state_size", U32, d_state)
    w.set(a + "ssm.time_step_rank", U32, ssm_heads)
    w.set(a + "ssm.group_count", U32, groups)
    if n_expert:
        w.set(a + "expert_count", U32, n_expert)
        w.set(a + "expert_used_count", U32, n_expert_used)
        w.set(a + "expert_feed_forward_length", U32, n_ff_exp)
        w.set(a + "expert_shared_feed_forward_length", U32, n_ff_shexp)
        w.set(a + "expert_weights_norm", BOOL, norm_weights)
        if scale is not None:
            w.set(a + "expert_weights_scale", F32, scale)
    rng = random.Random(seed)
    n_vocab = w.get(a + "vocab_size").value
    head_dim, conv_dim = n_embd // n_head, inner + 2 * groups * d_state
    w.tensors = []
    matrix, norm = tensor_writers(w, rng, weight_type, None, n_embd)

    def f32(name: str, ne: list[int], make) -> None:
        w.add_tensor(name, ne, GGML_F32, encode_f32([make() for _ in range(math.prod(ne))]))

    matrix("token_embd.weight", n_embd, n_vocab, 1.0)
    norm("output_norm.weight")
    matrix("output.weight", n_embd, n_vocab, 1.0 / math.sqrt(n_embd))
    for layer, kind in enumerate(pattern):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        if kind == "M":
            matrix(blk + "ssm_in.weight", n_embd, inner + conv_dim + ssm_heads, 1.0 / math.sqrt(n_embd))
            f32(blk + "ssm_conv1d.weight", [conv_len, conv_dim], lambda: rng.gauss(0.0, 0.5))
            f32(blk + "ssm_conv1d.bias", [conv_dim], lambda: rng.gauss(0.0, 0.1))
            f32(blk + "ssm_dt.bias", [ssm_heads], lambda: rng.uniform(-1.0, 1.0))
            f32(blk + "ssm_a", [1, ssm_heads], lambda: -math.exp(rng.uniform(-1.0, 1.0)))
            f32(blk + "ssm_d", [1, ssm_heads], lambda: rng.uniform(0.5, 1.5))
            f32(blk + "ssm_norm.weight", [inner // groups, groups], lambda: 1.0 + rng.uniform(-0.2, 0.2))
            matrix(blk + "ssm_out.weight", inner, n_embd, 2.0 / math.sqrt(inner))
        elif kind == "*":
            for part, rows in (("q", n_head * head_dim), ("k", n_head_kv * head_dim), ("v", n_head_kv * head_dim)):
                matrix(blk + f"attn_{part}.weight", n_embd, rows, 1.0 / math.sqrt(n_embd))
                if biases:
                    f32(blk + f"attn_{part}.bias", [rows], lambda: rng.gauss(0.0, 0.1))
            matrix(blk + "attn_output.weight", n_head * head_dim, n_embd, 2.0 / math.sqrt(n_embd))
            if biases:
                f32(blk + "attn_output.bias", [n_embd], lambda: rng.gauss(0.0, 0.1))
        elif not n_expert:
            matrix(blk + "ffn_up.weight", n_embd, n_ff, 2.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_down.weight", n_ff, n_embd, 1.0 / math.sqrt(n_ff))
            if biases:
                f32(blk + "ffn_up.bias", [n_ff], lambda: rng.gauss(0.0, 0.2))
                f32(blk + "ffn_down.bias", [n_embd], lambda: rng.gauss(0.0, 0.1))
        else:
            matrix(blk + "ffn_gate_inp.weight", n_embd, n_expert, 1.0 / math.sqrt(n_embd))
            f32(blk + "exp_probs_b.bias", [n_expert], lambda: rng.gauss(0.0, 0.2))
            matrix(blk + "ffn_up_exps.weight", n_embd, n_ff_exp, 2.0 / math.sqrt(n_embd), n_expert)
            matrix(blk + "ffn_down_exps.weight", n_ff_exp, n_embd, 1.0 / math.sqrt(n_ff_exp), n_expert)
            matrix(blk + "ffn_up_shexp.weight", n_embd, n_ff_shexp, 2.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_down_shexp.weight", n_ff_shexp, n_embd, 1.0 / math.sqrt(n_ff_shexp))
    return w


# ---- a tiny qwen3moe model --------------------------------------------------------

def build_tiny_qwen3moe(*, n_embd: int = 64, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2,
                        head_dim: int = 32, n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 32,
                        n_ctx: int = 128, norm: bool | None = None, scale: float | None = None,
                        weight_type: int = GGML_F32, seed: int = 1, n_ff_shexp: int = 0,
                        arch: str = "qwen3moe", n_vocab: int = 300, reserved: int = 0, tied: bool = False,
                        random_matrix=None) -> GGUFWriter:
    """A GGUFWriter holding a random-weight qwen3moe model laid out as llama.cpp's
    converter writes one, with build_tiny_llama's tokenizer: q/k head norms, a router
    (ffn_gate_inp) over n_expert experts stored as 3-d tensors, n_expert_used per
    token; expert_weights_norm and expert_weights_scale only when given. With
    n_ff_shexp, a shared SwiGLU expert of that width behind a sigmoid gate
    (ffn_gate_inp_shexp, one row). arch "qwen2moe" writes Qwen2-MoE instead: q/k/v
    biases in place of the head norms, heads n_embd / n_head wide, and always a shared
    expert (n_ff_shexp, default 2 * n_ff_exp). n_vocab, reserved and random_matrix as
    build_tiny_llama takes them (random_matrix(cols, rows * n, ...) for a stack of n)."""
    assert arch in ("qwen3moe", "qwen2moe"), arch
    if arch == "qwen2moe":
        head_dim, n_ff_shexp = n_embd // n_head, n_ff_shexp or 2 * n_ff_exp
    # The shared keys (heads, widths) as build_tiny_llama writes them, renamed.
    w = build_llama_base(arch, n_layer, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                         head_dim=head_dim, n_ff=n_ff_exp * n_expert_used, n_ctx=n_ctx, weight_type=weight_type,
                         name=f"tiny-{arch}", reserved=reserved, random_matrix=random_matrix)
    w.set(f"{arch}.expert_feed_forward_length", U32, n_ff_exp)
    w.set(f"{arch}.expert_count", U32, n_expert)
    w.set(f"{arch}.expert_used_count", U32, n_expert_used)
    if n_ff_shexp:
        w.set(f"{arch}.expert_shared_feed_forward_length", U32, n_ff_shexp)
    if norm is not None:
        w.set(f"{arch}.expert_weights_norm", BOOL, norm)
    if scale is not None:
        w.set(f"{arch}.expert_weights_scale", F32, scale)
    rng = random.Random(seed)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    w.tensors = []

    def matrix(name: str, ne: list[int], std: float) -> None:
        if random_matrix is not None:
            data = random_matrix(ne[0], math.prod(ne[1:]), std, rng)
        else:
            data = encode_tensor(weight_type, [rng.gauss(0.0, std) for _ in range(math.prod(ne))])
        w.add_tensor(name, ne, weight_type, data)

    def vector(name: str, n: int, mean: float, spread: float) -> None:
        w.add_tensor(name, [n], GGML_F32, encode_f32([mean + rng.uniform(-spread, spread) for _ in range(n)]))

    def norm_vector(name: str, n: int = n_embd) -> None:
        vector(name, n, 1.0, 0.2)

    matrix("token_embd.weight", [n_embd, n_vocab], 0.3)
    norm_vector("output_norm.weight")
    if not tied:
        matrix("output.weight", [n_embd, n_vocab], 0.3)
    for layer in range(n_layer):
        blk = f"blk.{layer}."
        norm_vector(blk + "attn_norm.weight")
        matrix(blk + "attn_q.weight", [n_embd, q_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_k.weight", [n_embd, kv_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_v.weight", [n_embd, kv_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_output.weight", [q_dim, n_embd], 2.0 / math.sqrt(q_dim))
        if arch == "qwen2moe":
            for part, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                vector(blk + f"attn_{part}.bias", n, 0.0, 0.5)
        else:
            norm_vector(blk + "attn_q_norm.weight", head_dim)
            norm_vector(blk + "attn_k_norm.weight", head_dim)
        norm_vector(blk + "ffn_norm.weight")
        w.add_tensor(blk + "ffn_gate_inp.weight", [n_embd, n_expert], GGML_F32,
                     encode_f32([rng.gauss(0.0, 1.0) for _ in range(n_embd * n_expert)]))
        matrix(blk + "ffn_gate_exps.weight", [n_embd, n_ff_exp, n_expert], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up_exps.weight", [n_embd, n_ff_exp, n_expert], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down_exps.weight", [n_ff_exp, n_embd, n_expert], 2.0 / math.sqrt(n_ff_exp))
        if n_ff_shexp:
            vector(blk + "ffn_gate_inp_shexp.weight", n_embd, 0.0, 2.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_gate_shexp.weight", [n_embd, n_ff_shexp], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_up_shexp.weight", [n_embd, n_ff_shexp], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_down_shexp.weight", [n_ff_shexp, n_embd], 2.0 / math.sqrt(n_ff_shexp))
    return w


def build_tiny_gpt_oss(*, n_embd: int = 64, n_layer: int = 4, n_head: int = 4, n_head_kv: int = 2,
                       head_dim: int = 32, n_expert: int = 4, n_expert_used: int = 2, n_ff_exp: int = 64,
                       n_ctx: int = 128, window: int = 32, yarn: tuple[float, int] | None = None,
                       sinks: float = 1.0, q_bias: bool = True, weight_type: int = GGML_F32,
                       expert_type: int | None = None, seed: int = 1, n_vocab: int = 300, reserved: int = 0,
                       chat_template: str = CHATML_TEMPLATE) -> GGUFWriter:
    """A GGUFWriter holding a random-weight gpt-oss model laid out as llama.cpp's converter
    writes one, with build_tiny_llama's tokenizer: heads of head_dim, q/k/v biases (with
    q_bias) and an output bias, a sink logit per query head drawn with spread `sinks`,
    even layers over a sliding window of `window` positions, the post_attention_norm
    before a router with a bias over n_expert experts (n_expert_used per token) with
    biases on gate, up and down. yarn = (factor, original context) scales RoPE as the
    published files do. Expert stacks are expert_type (default weight_type; MXFP4 as
    random blocks, as the published files hold them), the router and biases F32."""
    expert_type = weight_type if expert_type is None else expert_type
    w = build_llama_base("gpt-oss", n_layer, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                         head_dim=head_dim, n_ff=n_ff_exp, n_ctx=n_ctx, weight_type=weight_type,
                         name="tiny-gpt-oss", reserved=reserved, chat_template=chat_template)
    w.set("gpt-oss.attention.key_length", U32, head_dim)
    w.set("gpt-oss.attention.value_length", U32, head_dim)
    w.set("gpt-oss.rope.freq_base", F32, 150000.0)
    w.set("gpt-oss.expert_feed_forward_length", U32, n_ff_exp)
    w.set("gpt-oss.expert_count", U32, n_expert)
    w.set("gpt-oss.expert_used_count", U32, n_expert_used)
    w.set("gpt-oss.attention.sliding_window", U32, window)
    if yarn is not None:
        w.set("gpt-oss.rope.scaling.type", STRING, "yarn")
        w.set("gpt-oss.rope.scaling.factor", F32, yarn[0])
        w.set("gpt-oss.rope.scaling.original_context_length", U32, yarn[1])
    rng = random.Random(seed)
    n_vocab = w.get("gpt-oss.vocab_size").value
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    w.tensors = []

    def matrix(name: str, ne: list[int], std: float, ggml_type: int = weight_type) -> None:
        n = math.prod(ne)
        data = random_blocks(ggml_type, n, rng, std) if ggml_type == GGML_MXFP4 else \
            encode_tensor(ggml_type, [rng.gauss(0.0, std) for _ in range(n)])
        w.add_tensor(name, ne, ggml_type, data)

    def vector(name: str, ne: list[int], mean: float, spread: float) -> None:
        values = [mean + rng.uniform(-spread, spread) for _ in range(math.prod(ne))]
        w.add_tensor(name, ne, GGML_F32, encode_f32(values))

    matrix("token_embd.weight", [n_embd, n_vocab], 0.3)
    vector("output_norm.weight", [n_embd], 1.0, 0.2)
    matrix("output.weight", [n_embd, n_vocab], 0.3)
    for layer in range(n_layer):
        blk = f"blk.{layer}."
        vector(blk + "attn_norm.weight", [n_embd], 1.0, 0.2)
        matrix(blk + "attn_q.weight", [n_embd, q_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_k.weight", [n_embd, kv_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_v.weight", [n_embd, kv_dim], 1.0 / math.sqrt(n_embd))
        if q_bias:
            for part, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                vector(blk + f"attn_{part}.bias", [n], 0.0, 0.5)
        matrix(blk + "attn_output.weight", [q_dim, n_embd], 2.0 / math.sqrt(q_dim))
        vector(blk + "attn_output.bias", [n_embd], 0.0, 0.2)
        w.add_tensor(blk + "attn_sinks.weight", [n_head], GGML_F32,
                     encode_f32([rng.gauss(0.0, sinks) for _ in range(n_head)]))
        vector(blk + "post_attention_norm.weight", [n_embd], 1.0, 0.2)
        w.add_tensor(blk + "ffn_gate_inp.weight", [n_embd, n_expert], GGML_F32,
                     encode_f32([rng.gauss(0.0, 1.0) for _ in range(n_embd * n_expert)]))
        vector(blk + "ffn_gate_inp.bias", [n_expert], 0.0, 1.0)
        matrix(blk + "ffn_gate_exps.weight", [n_embd, n_ff_exp, n_expert], 2.0 / math.sqrt(n_embd), expert_type)
        matrix(blk + "ffn_up_exps.weight", [n_embd, n_ff_exp, n_expert], 2.0 / math.sqrt(n_embd), expert_type)
        matrix(blk + "ffn_down_exps.weight", [n_ff_exp, n_embd, n_expert], 2.0 / math.sqrt(n_ff_exp), expert_type)
        vector(blk + "ffn_gate_exps.bias", [n_ff_exp, n_expert], 0.0, 0.5)
        vector(blk + "ffn_up_exps.bias", [n_ff_exp, n_expert], 0.0, 0.5)
        vector(blk + "ffn_down_exps.bias", [n_embd, n_expert], 0.0, 0.2)
    return w


def build_tiny_lfm2(*, n_embd: int = 128, n_head: int = 4, kv_heads: tuple[int, ...] = (0, 2, 0, 0, 2),
                    n_ff: int = 256, conv_len: int = 3, n_ctx: int = 128, window: int = 0,
                    weight_type: int = GGML_F32, seed: int = 1) -> GGUFWriter:
    """A GGUFWriter holding a random-weight lfm2 model laid out as llama.cpp's converter
    writes one, with build_tiny_llama's tokenizer: one layer per entry of kv_heads, a
    short-convolution block (over conv_len positions) where it is 0 and Qwen3-style
    attention elsewhere (over a sliding window when window > 0), the final norm named
    token_embd_norm, the output head tied to the embeddings."""
    n_layer, n_head_kv = len(kv_heads), max(kv_heads)
    w = build_llama_base("lfm2", n_layer, n_embd=n_embd, n_head=n_head, n_ff=n_ff, n_ctx=n_ctx,
                         weight_type=weight_type, name="tiny-lfm2")
    w.set("lfm2.attention.head_count_kv", ARRAY, (I32, list(kv_heads)))
    w.set("lfm2.shortconv.l_cache", U32, conv_len)
    if window:
        w.set("lfm2.attention.sliding_window", U32, window)
    rng = random.Random(seed)
    n_vocab = w.get("lfm2.vocab_size").value
    head_dim = n_embd // n_head
    w.tensors = []

    def matrix(name: str, ne: list[int], std: float) -> None:
        values = [rng.gauss(0.0, std) for _ in range(math.prod(ne))]
        w.add_tensor(name, ne, weight_type, encode_tensor(weight_type, values))

    def norm(name: str, n: int = n_embd) -> None:
        w.add_tensor(name, [n], GGML_F32, encode_f32([1.0 + rng.uniform(-0.2, 0.2) for _ in range(n)]))

    matrix("token_embd.weight", [n_embd, n_vocab], 0.15)  # also the output head: logits of std ~1.7
    norm("token_embd_norm.weight")
    for layer, kv in enumerate(kv_heads):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        if kv == 0:
            matrix(blk + "shortconv.in_proj.weight", [n_embd, 3 * n_embd], 1.0 / math.sqrt(n_embd))
            w.add_tensor(blk + "shortconv.conv.weight", [conv_len, n_embd], GGML_F32,
                         encode_f32([rng.gauss(0.0, 0.6) for _ in range(conv_len * n_embd)]))
            matrix(blk + "shortconv.out_proj.weight", [n_embd, n_embd], 2.0 / math.sqrt(n_embd))
        else:
            matrix(blk + "attn_q.weight", [n_embd, n_head * head_dim], 1.0 / math.sqrt(n_embd))
            matrix(blk + "attn_k.weight", [n_embd, kv * head_dim], 1.0 / math.sqrt(n_embd))
            matrix(blk + "attn_v.weight", [n_embd, kv * head_dim], 1.0 / math.sqrt(n_embd))
            matrix(blk + "attn_output.weight", [n_head * head_dim, n_embd], 2.0 / math.sqrt(n_embd))
            norm(blk + "attn_q_norm.weight", head_dim)
            norm(blk + "attn_k_norm.weight", head_dim)
        norm(blk + "ffn_norm.weight")
        matrix(blk + "ffn_gate.weight", [n_embd, n_ff], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up.weight", [n_embd, n_ff], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down.weight", [n_ff, n_embd], 2.0 / math.sqrt(n_ff))
    return w


def build_tiny_granitehybrid(*, n_embd: int = 128, n_head: int = 4, kv_heads: tuple[int, ...] = (0, 2, 0, 0, 2),
                             n_ff: int = 256, conv_len: int = 4, ssm_heads: int = 8, groups: int = 2,
                             d_state: int = 16, n_ctx: int = 128, rope: bool = True, n_expert: int = 0,
                             n_expert_used: int = 2, n_ff_shexp: int = 96, seed: int = 1) -> GGUFWriter:
    """A GGUFWriter holding a random-weight granitehybrid model (Granite 4.0-H) laid out as
    llama.cpp's converter writes one, with build_tiny_llama's tokenizer: one layer per
    entry of kv_heads, a Mamba-2 block where it is 0 (ssm_heads heads of 2 · n_embd /
    ssm_heads channels, B and C in `groups` groups of d_state, a convolution over
    conv_len positions with its bias) and attention with q/k/v and output biases
    elsewhere, RoPE unless `rope` is False (rope.scaling.finetuned, as Granite 4.0-H's
    files say); Granite's four multipliers, none of them 1. With n_expert, in place of
    each FFN a softmax router over n_expert SwiGLU experts of n_ff (n_expert_used per
    token) and an ungated shared expert of n_ff_shexp."""
    n_layer, n_head_kv, inner = len(kv_heads), max(kv_heads), 2 * n_embd
    w = build_llama_base("granitehybrid", n_layer, n_embd=n_embd, n_head=n_head, n_ff=n_ff, n_ctx=n_ctx,
                         name="tiny-granitehybrid")
    a = "granitehybrid."
    w.set(a + "attention.head_count_kv", ARRAY, (I32, list(kv_heads)))
    w.set(a + "ssm.conv_kernel", U32, conv_len)
    w.set(a + "ssm.inner_size", U32, inner)
    w.set(a + "ssm.state_size", U32, d_state)
    w.set(a + "ssm.time_step_rank", U32, ssm_heads)
    w.set(a + "ssm.group_count", U32, groups)
    w.set(a + "embedding_scale", F32, 4.0)
    w.set(a + "residual_scale", F32, 0.5)
    w.set(a + "attention.scale", F32, 0.3)
    w.set(a + "logit_scale", F32, 2.0)
    if not rope:
        w.set(a + "rope.scaling.finetuned", BOOL, False)
    if n_expert:
        w.set(a + "expert_count", U32, n_expert)
        w.set(a + "expert_used_count", U32, n_expert_used)
        w.set(a + "expert_shared_feed_forward_length", U32, n_ff_shexp)
    rng = random.Random(seed)
    n_vocab = w.get(a + "vocab_size").value
    head_dim, conv_dim = n_embd // n_head, inner + 2 * groups * d_state
    w.tensors = []

    def f32(name: str, ne: list[int], make) -> None:
        w.add_tensor(name, ne, GGML_F32, encode_f32([make() for _ in range(math.prod(ne))]))

    def matrix(name: str, ne: list[int], std: float) -> None:
        f32(name, ne, lambda: rng.gauss(0.0, std))

    def norm(name: str, ne: list[int] | None = None) -> None:
        f32(name, ne or [n_embd], lambda: 1.0 + rng.uniform(-0.2, 0.2))

    matrix("token_embd.weight", [n_embd, n_vocab], 0.3)
    norm("output_norm.weight")
    matrix("output.weight", [n_embd, n_vocab], 0.3)  # logits of std ~1.7 after logit_scale
    for layer, kv in enumerate(kv_heads):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        if kv == 0:
            matrix(blk + "ssm_in.weight", [n_embd, inner + conv_dim + ssm_heads], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ssm_conv1d.weight", [conv_len, conv_dim], 0.5)
            matrix(blk + "ssm_conv1d.bias", [conv_dim], 0.1)
            f32(blk + "ssm_dt.bias", [ssm_heads], lambda: rng.uniform(-1.0, 1.0))
            f32(blk + "ssm_a", [1, ssm_heads], lambda: -math.exp(rng.uniform(-1.0, 1.0)))
            f32(blk + "ssm_d", [1, ssm_heads], lambda: rng.uniform(0.5, 1.5))
            norm(blk + "ssm_norm.weight", [inner // groups, groups])
            matrix(blk + "ssm_out.weight", [inner, n_embd], 2.0 / math.sqrt(inner))
        else:
            for part, rows in (("q", n_head * head_dim), ("k", kv * head_dim), ("v", kv * head_dim)):
                matrix(blk + f"attn_{part}.weight", [n_embd, rows], 1.0 / math.sqrt(n_embd))
                matrix(blk + f"attn_{part}.bias", [rows], 0.1)
            matrix(blk + "attn_output.weight", [n_head * head_dim, n_embd], 2.0 / math.sqrt(n_embd))
            matrix(blk + "attn_output.bias", [n_embd], 0.1)
        norm(blk + "ffn_norm.weight")
        if not n_expert:
            matrix(blk + "ffn_gate.weight", [n_embd, n_ff], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_up.weight", [n_embd, n_ff], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_down.weight", [n_ff, n_embd], 2.0 / math.sqrt(n_ff))
            continue
        matrix(blk + "ffn_gate_inp.weight", [n_embd, n_expert], 1.0)
        matrix(blk + "ffn_gate_exps.weight", [n_embd, n_ff, n_expert], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up_exps.weight", [n_embd, n_ff, n_expert], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down_exps.weight", [n_ff, n_embd, n_expert], 2.0 / math.sqrt(n_ff))
        matrix(blk + "ffn_gate_shexp.weight", [n_embd, n_ff_shexp], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up_shexp.weight", [n_embd, n_ff_shexp], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down_shexp.weight", [n_ff_shexp, n_embd], 2.0 / math.sqrt(n_ff_shexp))
    return w


def build_tiny_qwen35(*, n_embd: int = 128, n_layer: int = 4, interval: int = 4, n_head: int = 2,
                      n_head_kv: int = 1, head_dim: int = 64, rope_dim: int = 16,
                      sections: tuple[int, ...] = (3, 3, 2, 0), n_ff: int = 256, k_heads: int = 2,
                      v_heads: int = 4, state: int = 32, conv_len: int = 4, n_ctx: int = 128,
                      weight_type: int = GGML_F32, seed: int = 1, n_vocab: int = 300, reserved: int = 0,
                      random_matrix=None, n_expert: int = 0, n_expert_used: int = 2, n_ff_exp: int = 64,
                      n_ff_shexp: int = 96, nextn: int = 0) -> GGUFWriter:
    """A GGUFWriter holding a random-weight qwen35 model laid out as llama.cpp's converter
    writes one, with build_tiny_llama's tokenizer: every `interval`-th layer gated
    attention (queries and gate interleaved per head in attn_q, q/k head norms, RoPE over
    rope_dim dims of each head in multi-`sections`), the others Gated DeltaNet layers
    (k_heads query/key heads and v_heads value heads of `state` dims, a convolution over
    conv_len positions); post_attention_norm before every SwiGLU FFN. With n_expert, a
    qwen35moe model instead: in place of each FFN a router over n_expert SwiGLU experts
    of n_ff_exp (n_expert_used per token) and a shared expert of n_ff_shexp behind a
    sigmoid gate; and `nextn` multi-token-prediction blocks after the n_layer (block_count
    counts them): gated attention, the same MoE and the blk.N.nextn.* tensors. n_vocab,
    reserved and random_matrix as build_tiny_llama takes them."""
    arch = "qwen35moe" if n_expert else "qwen35"
    w = build_llama_base(arch, n_layer + nextn, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                         n_ctx=n_ctx, weight_type=weight_type, name=f"tiny-{arch}", n_vocab=n_vocab,
                         reserved=reserved, random_matrix=random_matrix)
    w.set(f"{arch}.attention.key_length", U32, head_dim)  # even where it is n_embd / n_head
    w.set(f"{arch}.attention.value_length", U32, head_dim)
    w.set(f"{arch}.rope.dimension_count", U32, rope_dim)
    w.set(f"{arch}.rope.dimension_sections", ARRAY, (I32, list(sections)))
    w.set(f"{arch}.full_attention_interval", U32, interval)
    w.set(f"{arch}.ssm.conv_kernel", U32, conv_len)
    w.set(f"{arch}.ssm.inner_size", U32, v_heads * state)
    w.set(f"{arch}.ssm.state_size", U32, state)
    w.set(f"{arch}.ssm.time_step_rank", U32, v_heads)
    w.set(f"{arch}.ssm.group_count", U32, k_heads)
    if n_expert:
        w.set(f"{arch}.expert_count", U32, n_expert)
        w.set(f"{arch}.expert_used_count", U32, n_expert_used)
        w.set(f"{arch}.expert_feed_forward_length", U32, n_ff_exp)
        w.set(f"{arch}.expert_shared_feed_forward_length", U32, n_ff_shexp)
    if nextn:
        w.set(f"{arch}.nextn_predict_layers", U32, nextn)
    rng = random.Random(seed)
    n_vocab = w.get(f"{arch}.vocab_size").value
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    qk_dim, v_dim = k_heads * state, v_heads * state
    conv_dim = 2 * qk_dim + v_dim
    w.tensors = []

    def matrix(name: str, ne: list[int], std: float) -> None:
        if random_matrix is not None:
            w.add_tensor(name, ne, weight_type, random_matrix(ne[0], math.prod(ne[1:]), std, rng))
            return
        values = [rng.gauss(0.0, std) for _ in range(math.prod(ne))]
        w.add_tensor(name, ne, weight_type, encode_tensor(weight_type, values))

    def f32(name: str, ne: list[int], make) -> None:
        w.add_tensor(name, ne, GGML_F32, encode_f32([make() for _ in range(math.prod(ne))]))

    def norm(name: str, n: int = n_embd) -> None:
        f32(name, [n], lambda: 1.0 + rng.uniform(-0.2, 0.2))

    def attention(blk: str) -> None:
        matrix(blk + "attn_q.weight", [n_embd, 2 * q_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_k.weight", [n_embd, kv_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_v.weight", [n_embd, kv_dim], 1.0 / math.sqrt(n_embd))
        matrix(blk + "attn_output.weight", [q_dim, n_embd], 2.0 / math.sqrt(q_dim))
        norm(blk + "attn_q_norm.weight", head_dim)
        norm(blk + "attn_k_norm.weight", head_dim)

    def ffn(blk: str) -> None:
        norm(blk + "post_attention_norm.weight")
        if not n_expert:
            matrix(blk + "ffn_gate.weight", [n_embd, n_ff], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_up.weight", [n_embd, n_ff], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ffn_down.weight", [n_ff, n_embd], 2.0 / math.sqrt(n_ff))
            return
        f32(blk + "ffn_gate_inp.weight", [n_embd, n_expert], lambda: rng.gauss(0.0, 1.0))
        matrix(blk + "ffn_gate_exps.weight", [n_embd, n_ff_exp, n_expert], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up_exps.weight", [n_embd, n_ff_exp, n_expert], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down_exps.weight", [n_ff_exp, n_embd, n_expert], 2.0 / math.sqrt(n_ff_exp))
        f32(blk + "ffn_gate_inp_shexp.weight", [n_embd], lambda: rng.gauss(0.0, 2.0 / math.sqrt(n_embd)))
        matrix(blk + "ffn_gate_shexp.weight", [n_embd, n_ff_shexp], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_up_shexp.weight", [n_embd, n_ff_shexp], 1.0 / math.sqrt(n_embd))
        matrix(blk + "ffn_down_shexp.weight", [n_ff_shexp, n_embd], 2.0 / math.sqrt(n_ff_shexp))

    matrix("token_embd.weight", [n_embd, n_vocab], 0.3)
    norm("output_norm.weight")
    matrix("output.weight", [n_embd, n_vocab], 0.15)  # logits of std ~1.7
    for layer in range(n_layer):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        if (layer + 1) % interval == 0:
            attention(blk)
        else:
            matrix(blk + "attn_qkv.weight", [n_embd, conv_dim], 1.0 / math.sqrt(n_embd))
            matrix(blk + "attn_gate.weight", [n_embd, v_dim], 1.0 / math.sqrt(n_embd))
            f32(blk + "ssm_conv1d.weight", [conv_len, conv_dim], lambda: rng.gauss(0.0, 0.5))
            f32(blk + "ssm_dt.bias", [v_heads], lambda: rng.uniform(-1.0, 1.0))
            f32(blk + "ssm_a", [v_heads], lambda: -math.exp(rng.uniform(-1.0, 1.0)))
            matrix(blk + "ssm_beta.weight", [n_embd, v_heads], 1.0 / math.sqrt(n_embd))
            matrix(blk + "ssm_alpha.weight", [n_embd, v_heads], 1.0 / math.sqrt(n_embd))
            norm(blk + "ssm_norm.weight", state)
            matrix(blk + "ssm_out.weight", [v_dim, n_embd], 2.0 / math.sqrt(v_dim))
        ffn(blk)
    for layer in range(n_layer, n_layer + nextn):
        blk = f"blk.{layer}."
        norm(blk + "attn_norm.weight")
        attention(blk)
        ffn(blk)
        matrix(blk + "nextn.eh_proj.weight", [2 * n_embd, n_embd], 1.0 / math.sqrt(2 * n_embd))
        norm(blk + "nextn.enorm.weight")
        norm(blk + "nextn.hnorm.weight")
        norm(blk + "nextn.shared_head_norm.weight")
    return w


# ---- vocabularies without weights ------------------------------------------------

def _vocab_only_writer(name: str) -> GGUFWriter:
    """A GGUF with the llama hyperparameters llama.cpp reads even for a vocabulary
    alone, and no tensors; the caller adds the tokenizer."""
    w = GGUFWriter()
    w.set("general.architecture", STRING, "llama")
    w.set("general.name", STRING, name)
    for key, value in (("context_length", 128), ("embedding_length", 64), ("block_count", 1),
                       ("feed_forward_length", 128), ("attention.head_count", 4),
                       ("attention.head_count_kv", 4)):
        w.set(f"llama.{key}", U32, value)
    w.set("llama.attention.layer_norm_rms_epsilon", F32, 1e-5)
    return w


def build_split_vocab(texts: list[str], pre: str, *, max_len: int = 8) -> GGUFWriter:
    """A vocab-only GGUF (no tensors) whose BPE output shows the pre-tokenizer's words.

    Tokens: the 256 GPT-2 byte characters, then every substring of the texts' bytes
    of 2..max_len bytes; merges: every split of each such substring into two
    shorter ones. Any word of at most max_len bytes taken from the texts therefore
    ends as one token, so the ids of a text spell out where `pre` cut it; longer
    words end in a few tokens, the same in any correct BPE."""
    byte_chars = gpt2_byte_chars()
    tokens = list(byte_chars)
    known = set(tokens)
    merges: list[str] = []
    for text in texts:
        data = [byte_chars[b] for b in text.encode()]
        for start in range(len(data)):
            for end in range(start + 2, min(len(data), start + max_len) + 1):
                joined = "".join(data[start:end])
                if joined in known:
                    continue
                known.add(joined)
                tokens.append(joined)
                for cut in range(start + 1, end):
                    merges.append("".join(data[start:cut]) + " " + "".join(data[cut:end]))
    w = _vocab_only_writer(f"split-{pre}")
    w.set("tokenizer.ggml.model", STRING, "gpt2")
    w.set("tokenizer.ggml.pre", STRING, pre)
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    w.set("tokenizer.ggml.token_type", ARRAY, (I32, [1] * len(tokens)))
    w.set("tokenizer.ggml.merges", ARRAY, (STRING, merges))
    return w


def build_spm_vocab(texts: list[str], *, add_space_prefix: bool, max_len: int = 6) -> GGUFWriter:
    """A vocab-only SentencePiece GGUF (tokenizer.ggml.model "llama") in Gemma's shape.

    Tokens: <pad> <eos> <bos> <unk>, <start_of_turn> and <end_of_turn> (control), the
    256 byte tokens <0x00>..<0xFF>, then every substring of up to max_len characters
    of the texts with spaces written U+2581, except characters outside the Basic
    Multilingual Plane (so byte fallback is exercised). A piece scores its length,
    minus a little per id, so merges prefer long pieces and never tie."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    known = set(tokens)
    pieces: list[str] = []
    for text in texts:
        chars = [c for c in text.replace(" ", "\u2581")]
        for start in range(len(chars)):
            for end in range(start + 1, min(len(chars), start + max_len) + 1):
                piece = "".join(chars[start:end])
                if piece not in known and all(ord(c) < 0x10000 for c in piece):
                    known.add(piece)
                    pieces.append(piece)
    scores = [0.0] * len(tokens) + [len(p) - 1e-4 * i for i, p in enumerate(pieces)]
    tokens += pieces
    types += [1] * len(pieces)
    w = _vocab_only_writer("spm-test")
    w.set("tokenizer.ggml.model", STRING, "llama")
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    w.set("tokenizer.ggml.scores", ARRAY, (F32, scores))
    w.set("tokenizer.ggml.token_type", ARRAY, (I32, types))
    w.set("tokenizer.ggml.bos_token_id", U32, 2)
    w.set("tokenizer.ggml.eos_token_id", U32, 1)
    w.set("tokenizer.ggml.unknown_token_id", U32, 3)
    w.set("tokenizer.ggml.padding_token_id", U32, 0)
    w.set("tokenizer.ggml.add_space_prefix", BOOL, add_space_prefix)
    return w
