"""`python -m llmd quantize IN.gguf OUT.gguf TYPE`: a GGUF model re-encoded as one of
the file mixes people download (Q4_K_M, Q8_0, ...).

Theory of operation. read_gguf() parses IN's header (every count and length checked
against the bytes there are) into its metadata, kept as raw bytes, and its tensor
infos. plan() is pure: from the tensors' names, shapes and types, the model's
architecture, layer and expert counts, and the mix, it picks each tensor's type
with llama-quantize's rules (RULES, one table), so a file made here holds the same
types per tensor as one made by llama-quantize. write_gguf() writes OUT's header
(IN's metadata with general.file_type and general.quantization_version set, the
tensor infos in IN's order with their new types and offsets), then each tensor's
data, re-encoded by the engine's quantizers (llmd_quantize_rows: decode by the
source type, encode by the target's reference algorithm, over all cores) or
copied when its type stays, into OUT.tmp, renamed to OUT when complete.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
import sys
import time
from dataclasses import dataclass
from typing import Callable

# GGUF type numbers used here.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0",
              Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", BF16: "BF16"}
BLOCK = {F32: 1, F16: 1, BF16: 1, Q4_0: 32, Q4_1: 32, Q5_0: 32, Q5_1: 32, Q8_0: 32, Q4_K: 256, Q5_K: 256, Q6_K: 256}
QUANTIZATION_VERSION = 2
DEFAULT_ALIGNMENT = 32


class QuantizeError(Exception):
    """What went wrong, in words for the person who ran the command."""


@dataclass(frozen=True)
class Mix:
    name: str
    file_type: int  # general.file_type (llama.cpp's LLAMA_FTYPE_MOSTLY_* number)
    default: int    # the type of every matrix no rule picks another for


MIXES = {m.name: m for m in [
    Mix("F32", 0, F32), Mix("F16", 1, F16), Mix("BF16", 32, BF16),
    Mix("Q8_0", 7, Q8_0), Mix("Q4_0", 2, Q4_0), Mix("Q4_1", 3, Q4_1), Mix("Q5_0", 8, Q5_0), Mix("Q5_1", 9, Q5_1),
    Mix("Q4_K_S", 14, Q4_K), Mix("Q4_K_M", 15, Q4_K), Mix("Q5_K_S", 16, Q5_K), Mix("Q5_K_M", 17, Q5_K),
    Mix("Q6_K", 18, Q6_K),
]}

# ---- which tensors are matrices to quantize -----------------------------------

# Tensors llama-quantize leaves in their type even when 2-D: norms, routers, small
# convolutions and mixing weights, position and token-type embeddings, and
# multimodal pieces. A substring anywhere in the name.
KEEP_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_first.weight",
    "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
    "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
KEEP_NAMES = ("position_embd.weight", "token_types.weight")


def is_matrix(name: str, n_dims: int) -> bool:
    """A weight llama-quantize quantizes: 2-D or more, named *weight, not kept above."""
    return (n_dims >= 2 and name.endswith("weight") and name not in KEEP_NAMES
            and not any(s in name for s in KEEP_SUBSTRINGS))


def category(name: str) -> str:
    """The tensor's role as llama-quantize's rules see it (the first match)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
                      ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                      ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                      ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


# ---- the mix rules ---------------------------------------------------------------

def more_bits(i: int, n: int) -> bool:
    """The layers a *_M mix gives more bits: the first and last eighth, and every
    third layer between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@dataclass(frozen=True)
class Where:
    """What a rule may look at: the mix, the tensor's layer among n (for attn_v the
    count of attn_v-like tensors so far, as llama-quantize counts them), the model."""
    mix: str
    i: int
    n: int
    arch: str
    n_expert: int
    is_70b: bool


@dataclass(frozen=True)
class Rule:
    category: str
    stage: int                        # stages apply in order; in a stage the first match wins
    mixes: tuple[str, ...]
    when: Callable[[Where, int], bool]  # (where, the type chosen so far)
    type: int
    why: str


# llama-quantize's choices for the mixes above (its llama_tensor_get_type, without an
# importance matrix). The output matrix (or the token embedding a model ties to it)
# is decided before these (output_type()); a row that is not whole blocks of the
# chosen type falls back afterwards (fallback()).
RULES: tuple[Rule, ...] = (
    Rule("attn_v", 0, ("Q4_K_M", "Q5_K_M"), lambda w, t: more_bits(w.i, w.n), Q6_K, "more bits on chosen layers"),
    Rule("attn_v", 0, ("Q4_K_S",), lambda w, t: w.i < 4, Q5_K, "the first four attn_v"),
    Rule("attn_v", 1, ("Q4_K_S", "Q4_K_M"), lambda w, t: w.is_70b and t == Q4_K, Q5_K,
         "70B: attn_v is 8x smaller than attn_q"),
    Rule("attn_v", 2, tuple(MIXES), lambda w, t: w.n_expert == 8, Q8_0, "8-expert models"),
    Rule("attn_k", 0, tuple(MIXES), lambda w, t: w.n_expert == 8, Q8_0, "8-expert models"),
    Rule("ffn_down", 0, ("Q4_K_M",), lambda w, t: w.arch == "falcon" and w.i < w.n // 16, Q6_K,
         "falcon: the first 16th"),
    Rule("ffn_down", 0, ("Q4_K_M",), lambda w, t: w.arch == "falcon" and more_bits(w.i, w.n), Q5_K,
         "falcon: more bits on chosen layers"),
    Rule("ffn_down", 0, ("Q4_K_M", "Q5_K_M"), lambda w, t: w.arch != "falcon" and more_bits(w.i, w.n), Q6_K,
         "more bits on chosen layers"),
    Rule("ffn_down", 0, ("Q4_K_S",), lambda w, t: w.arch != "falcon" and w.i < w.n // 8, Q5_K, "the first eighth"),
    Rule("attn_output", 0, ("Q4_K_S", "Q4_K_M"), lambda w, t: w.arch != "falcon" and w.n_expert == 8, Q5_K,
         "8-expert models"),
)
STAGES = sorted({r.stage for r in RULES})


def apply_rules(cat: str, where: Where, default: int) -> int:
    """The mix's default type for a tensor of category `cat`, as RULES change it."""
    chosen = default
    for stage in STAGES:
        for rule in RULES:
            if rule.stage == stage and rule.category == cat and where.mix in rule.mixes and rule.when(where, chosen):
                chosen = rule.type
                break
    return chosen


# The type a row that is not whole blocks of a K-quant falls back to.
FALLBACK = {Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0}

# Models llama.cpp counts as 70B (the attn_v rule above): architecture -> layers.
SEVENTY_B_LAYERS = {"llama": 80, "qwen2": 80, "olmo": 80, "deci": 80, "jais2": 68}


def output_type(mix: Mix, cols: int, arch: str) -> int:
    """The output matrix (or a tied token embedding): Q8_0 where a row is not whole
    blocks of the mix's type or for falcon, else Q6_K (Q8_0 stays Q8_0)."""
    if arch == "falcon" or cols % BLOCK[mix.default] != 0:
        return Q8_0
    return Q8_0 if mix.default == Q8_0 else Q6_K


def fallback(wanted: int, cols: int) -> int:
    """The type a row of `cols` elements can hold: K-quants fall back to a
    32-element type, and to F16 when even that does not divide the row."""
    chosen = FALLBACK.get(wanted, wanted) if cols % BLOCK[wanted] else wanted
    return chosen if cols % BLOCK[chosen] == 0 else F16


# ---- the plan -----------------------------------------------------------------

@dataclass
class TensorInfo:
    name: str
    shape: list[int]  # ne: shape[0] is the row length
    type: int
    offset: int       # from the start of the data section

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n


def layer_of(name: str) -> int:
    """blk.N.… -> N, else -1."""
    if name.startswith("blk."):
        head = name[4:].split(".", 1)[0]
        if head.isdigit():
            return int(head)
    return -1


def plan(tensors: list[TensorInfo], mix: Mix, arch: str, n_layer: int, n_expert: int, n_head: int = 0,
         n_head_kv: int = 0) -> list[int]:
    """Each tensor's type in the mix, in the order of `tensors`. llama-quantize visits
    tensors by layer, then by name, and counts attn_v-like and ffn_down tensors in
    that order; plan() counts the same way."""
    quantized = mix.default not in (F16, BF16, F32)
    names = [t.name for t in tensors]
    tied = "output.weight" not in names
    n_attn_v = sum(1 for t in tensors if category(t.name) == "attn_v")
    is_70b = n_layer == SEVENTY_B_LAYERS.get(arch) and (arch != "llama" or n_head != n_head_kv)
    counters = {"attn_v": 0, "ffn_down": 0}
    chosen: dict[str, int] = {}
    for t in sorted(tensors, key=lambda t: (layer_of(t.name), t.name)):
        if not is_matrix(t.name, len(t.shape)):
            chosen[t.name] = t.type
            continue
        if not quantized:
            chosen[t.name] = mix.default
            continue
        cat = category(t.name)
        cols = t.shape[0]
        if cat == "output" or (tied and cat == "token_embd"):
            wanted = output_type(mix, cols, arch)
        else:
            i = n = 0
            if cat in counters:  # attn_v-like and ffn_down tensors are counted as visited
                i, n = counters[cat], n_attn_v if cat == "attn_v" else n_layer
                counters[cat] += 1
                if cat == "ffn_down" and n_expert > 1:
                    i = layer_of(t.name)  # experts' tensors are not one per layer in order
            wanted = apply_rules(cat, Where(mix.name, i, n, arch, n_expert, is_70b), mix.default)
        chosen[t.name] = fallback(wanted, cols)
    return [chosen[t.name] for t in tensors]


# ---- reading a GGUF header ----------------------------------------------------------

# GGUF metadata value types: fixed sizes, and the two variable ones.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U32 = 4
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


@dataclass
class GGUFHeader:
    kvs: list[tuple[str, bytes]]  # (key, the key/value pair's bytes as in the file)
    values: dict[str, object]     # scalar and string values by key (arrays are skipped)
    tensors: list[TensorInfo]
    alignment: int
    data_start: int               # file offset of the data section


class _Reader:
    """A cursor over the file's bytes: every read checks the bytes left first."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise QuantizeError(f"truncated GGUF: {what} at byte {self.pos} runs past the end of the file")
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.scalar("<Q", what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise QuantizeError(f"corrupt GGUF: {what} at byte {self.pos - len(raw)} is not UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0):
        """The value (None for arrays, which are only skipped)."""
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY and depth == 0:
            elem, count = self.scalar("<I", what), self.scalar("<Q", what)
            if elem in _SCALAR:
                self.take(count * struct.calcsize(_SCALAR[elem]), what)
            elif count > self.size - self.pos:
                raise QuantizeError(f"truncated GGUF: {what} holds {count} elements, more than the bytes left")
            else:
                for _ in range(count):
                    self.value(elem, what, depth + 1)
            return None
        raise QuantizeError(f"corrupt GGUF: {what} has value type {vtype}, which GGUF does not define here")


def read_gguf(buf, size: int) -> GGUFHeader:
    """The header of the GGUF file in `buf`, checked against its `size` bytes."""
    from llmd.engine.native import tensor_type
    r = _Reader(buf, size)
    if r.take(4, "the magic") != b"GGUF":
        raise QuantizeError("not a GGUF file (it does not start with 'GGUF')")
    version = r.scalar("<I", "the version")
    if version not in (2, 3):
        raise QuantizeError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = r.scalar("<Q", "the tensor count"), r.scalar("<Q", "the metadata count")
    if n_tensors > size or n_kv > size:
        raise QuantizeError(f"corrupt GGUF: {n_tensors} tensors and {n_kv} metadata pairs cannot fit in {size} bytes")
    kvs, values = [], {}
    for i in range(n_kv):
        start = r.pos
        key = r.string(f"metadata key {i}")
        value = r.value(r.scalar("<I", f"the type of {key}"), key)
        if key in values or any(k == key for k, _ in kvs):
            raise QuantizeError(f"corrupt GGUF: metadata key {key} appears twice")
        kvs.append((key, bytes(buf[start:r.pos])))
        if value is not None:
            values[key] = value
    alignment = values.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise QuantizeError(f"corrupt GGUF: general.alignment {alignment} is not a power of two")
    tensors, seen = [], set()
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}")
        n_dims = r.scalar("<I", f"the dimensions of {name}")
        if not 1 <= n_dims <= 4:
            raise QuantizeError(f"corrupt GGUF: tensor {name} has {n_dims} dimensions (1 to 4 allowed)")
        shape = [r.scalar("<Q", f"the shape of {name}") for _ in range(n_dims)]
        ttype, offset = r.scalar("<I", f"the type of {name}"), r.scalar("<Q", f"the offset of {name}")
        info = tensor_type(ttype)
        if info is None:
            raise QuantizeError(f"corrupt GGUF: tensor {name} has type {ttype}, which GGUF does not define")
        if name in seen:
            raise QuantizeError(f"corrupt GGUF: tensor {name} appears twice")
        if any(d <= 0 for d in shape) or shape[0] % info.block_elems:
            raise QuantizeError(f"corrupt GGUF: tensor {name} has shape {shape}, not whole {info.name} blocks per row")
        seen.add(name)
        tensors.append(TensorInfo(name, shape, ttype, offset))
    data_start = _padded(r.pos, alignment)
    for t in tensors:
        nbytes = tensor_bytes(t.type, t.shape)
        if t.offset % alignment or data_start + t.offset + nbytes > size:
            raise QuantizeError(f"corrupt GGUF: tensor {t.name}'s data ({nbytes} bytes at offset {t.offset}) is "
                                f"misaligned or runs past the end of the file")
    return GGUFHeader(kvs, values, tensors, alignment, data_start)


def tensor_bytes(ttype: int, shape: list[int]) -> int:
    from llmd.engine.native import tensor_type
    return math.prod(shape[1:]) * tensor_type(ttype).row_bytes(shape[0])


# ---- writing --------------------------------------------------------------------

def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _kv_u32(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<II", _U32, value)


def header_bytes(header: GGUFHeader, types: list[int], mix: Mix) -> bytes:
    """OUT's header, padded to the alignment: tensors laid out in IN's order."""
    kvs = [(k, raw) for k, raw in header.kvs if k not in SPLIT_KEYS]
    for key, value in (("general.quantization_version", QUANTIZATION_VERSION), ("general.file_type", mix.file_type)):
        at = next((i for i, (k, _) in enumerate(kvs) if k == key), None)
        if at is None:
            kvs.append((key, _kv_u32(key, value)))
        else:
            kvs[at] = (key, _kv_u32(key, value))
    out = [b"GGUF", struct.pack("<IQQ", 3, len(header.tensors), len(kvs))] + [raw for _, raw in kvs]
    at = 0
    for t, ttype in zip(header.tensors, types):
        out.append(_string(t.name) + struct.pack("<I", len(t.shape)) + struct.pack(f"<{len(t.shape)}Q", *t.shape)
                   + struct.pack("<IQ", ttype, at))
        at += _padded(tensor_bytes(ttype, t.shape), header.alignment)
    head = b"".join(out)
    return head + bytes(_padded(len(head), header.alignment) - len(head))


def _padded(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# Rows converted per call, so that a large matrix never needs its whole output in memory.
CHUNK_BYTES = 64 << 20


def convert(buf, header: GGUFHeader, t: TensorInfo, new_type: int, n_threads: int):
    """The tensor's data in new_type, in chunks of whole rows."""
    from llmd.engine.native import quantize_rows
    src_row = tensor_bytes(t.type, [t.shape[0]])
    dst_row = tensor_bytes(new_type, [t.shape[0]])
    per_chunk = max(1, CHUNK_BYTES // max(src_row, dst_row))
    start = header.data_start + t.offset
    for r0 in range(0, t.rows, per_chunk):
        n = min(per_chunk, t.rows - r0)
        src = memoryview(buf)[start + r0 * src_row:start + (r0 + n) * src_row]
        try:
            yield quantize_rows(t.type, src, n, t.shape[0], new_type, n_threads)
        finally:
            src.release()


def quantize_file(src: str, dst: str, mix_name: str, *, n_threads: int = 0, allow_requantize: bool = False,
                  out=None) -> int:
    """Writes `dst`, the GGUF at `src` in the mix `mix_name`, with a line per tensor to
    `out` (default stdout); returns the bytes written."""
    out = out if out is not None else sys.stdout
    from llmd.engine.native import tensor_type
    mix = MIXES.get(mix_name.upper())
    if mix is None:
        raise QuantizeError(f"unknown type {mix_name!r}; known: {', '.join(MIXES)}")
    if not os.path.isfile(src):
        raise QuantizeError(f"{src}: no such file")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise QuantizeError("the output would overwrite the input; name another file")
    started = time.monotonic()
    with open(src, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise QuantizeError(f"{src}: empty file, not a GGUF")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = read_gguf(buf, size)
            parts = header.values.get("split.count", 1)
            if not isinstance(parts, int) or isinstance(parts, bool):
                raise QuantizeError(f"corrupt GGUF: split.count is {parts!r}, not a count of parts")
            if parts > 1:
                raise QuantizeError(f"{src} is one part of a split GGUF; merge the parts first")
            arch = str(header.values.get("general.architecture", ""))
            def hparam(key: str) -> int:
                value = header.values.get(f"{arch}.{key}", 0)
                return value if isinstance(value, int) else 0
            types = plan(header.tensors, mix, arch, hparam("block_count"), hparam("expert_count"),
                         hparam("attention.head_count"), hparam("attention.head_count_kv"))
            changed = [(t, new) for t, new in zip(header.tensors, types) if new != t.type]
            unreadable = [t for t, _ in changed if not (tensor_type(t.type) and tensor_type(t.type).runs)]
            if unreadable:
                raise QuantizeError(f"cannot read tensors of type {tensor_type(unreadable[0].type).name} "
                                    f"({unreadable[0].name} and {len(unreadable) - 1} more)")
            requant = [t for t, _ in changed if t.type not in (F32, F16, BF16)]
            if requant and not allow_requantize:
                raise QuantizeError(f"{src} is already quantized ({requant[0].name} is "
                                    f"{tensor_type(requant[0].type).name}): requantizing loses quality; pass "
                                    f"--allow-requantize to do it anyway")
            return _write(dst, buf, header, types, header_bytes(header, types, mix), n_threads, out, started,
                          requant)


def _write(dst: str, buf, header: GGUFHeader, types: list[int], head: bytes, n_threads: int, out, started: float,
           requant: list[TensorInfo]) -> int:
    from llmd.engine.native import EngineError, tensor_type
    folder = os.path.dirname(os.path.abspath(dst))
    tmp = os.path.join(folder, f".{os.path.basename(dst)}.{os.getpid()}.tmp")
    try:
        f = open(tmp, "wb")
    except OSError as exc:
        raise QuantizeError(f"cannot write {dst}: {exc.strerror}") from None
    try:
        with f:
            f.write(head)
            written = len(head)
            if requant:
                print(f"requantizing {len(requant)} tensors that are already quantized", file=out)
            for k, (t, new_type) in enumerate(zip(header.tensors, types)):
                print(f"[{k + 1:4}/{len(types)}] {t.name:40} {str(t.shape):22} {tensor_type(t.type).name:>5} -> "
                      f"{tensor_type(new_type).name}", file=out)
                nbytes = tensor_bytes(new_type, t.shape)
                if new_type == t.type:
                    start = header.data_start + t.offset
                    for at in range(start, start + nbytes, CHUNK_BYTES):
                        f.write(buf[at:min(at + CHUNK_BYTES, start + nbytes)])
                else:
                    try:
                        for chunk in convert(buf, header, t, new_type, n_threads):
                            f.write(chunk)
                    except EngineError as exc:
                        raise QuantizeError(f"{t.name}: {exc}") from None
                pad = _padded(nbytes, header.alignment) - nbytes
                f.write(bytes(pad))
                written += nbytes + pad
        os.replace(tmp, dst)
    except OSError as exc:
        raise QuantizeError(f"cannot write {dst}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"wrote {dst}: {written / 1e6:.1f} MB in {time.monotonic() - started:.1f} s", file=out)
    return written
