"""`llmd quantize` (llmd/commands/quantize.py) and the engine's quantizers (native/src/quants/quantize.cpp).

Golden facts (tests/data/quantize_golden.json, made by tests/support/make_quantize_golden.py
from llama.cpp): the bytes llama.cpp's reference quantizers make from fixed rows,
and the type llama-quantize gives every tensor of tiny models in every mix.
"""
import hashlib
import json
import math
import mmap
import os
import random
import struct
from pathlib import Path

import pytest

from llmd import cli
from llmd.commands.quantize import MIXES, TYPE_NAMES, QuantizeError, plan, quantize_file, read_gguf
from llmd.engine.native import Engine, EngineError, quantize_rows
from tests.support import gguf_writer as gw
from tests.support.make_quantize_golden import (DIGEST_COLS, DIGEST_ROWS, TINY_MODELS, TYPES, digest_matrix, golden_rows,
                                        write_tiny_model)

GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "quantize_golden.json").read_text())
F32 = 0


def floats(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def quantize(type_id: int, values, n_threads: int = 1) -> bytes:
    return bytes(quantize_rows(F32, floats(values), 1, len(values), type_id, n_threads))


def header(path: Path):
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return read_gguf(buf, len(buf))


# ---- the quantizers ------------------------------------------------------------------

@pytest.mark.parametrize("name", list(TYPES))
def test_quantizer_bytes_equal_llama_cpp_reference(name):
    for i, row in enumerate(golden_rows()):
        assert quantize(TYPES[name], row).hex() == GOLDEN["rows"][name][i], f"{name} row {i}"


@pytest.fixture(scope="module")
def matrix() -> bytes:
    return digest_matrix()


@pytest.mark.parametrize("name", list(TYPES))
def test_quantizer_matches_llama_cpp_on_a_quarter_million_values(name, matrix):
    data = quantize_rows(F32, matrix, DIGEST_ROWS, DIGEST_COLS, TYPES[name], 2)
    assert hashlib.sha256(data).hexdigest() == GOLDEN["digests"][name]


# Largest error per 32-element block as a fraction of the block's max |x| (the
# block's step, halved where the code is rounded to nearest; a whole step where
# llama.cpp's Q4_0/Q5_0 cap the far end), plus 2^-9 for the f16 scale's and min's
# rounding (at most 3 × 2^-11 of max |x|).
BLOCK_BOUND = {"Q8_0": 0.5 / 127, "Q4_0": 1 / 8, "Q5_0": 1 / 16, "Q4_1": 1.0 / 15, "Q5_1": 1.0 / 31}
# RMS error as a fraction of the row's RMS, for Gaussian rows (measured: Q4_K 0.066,
# Q5_K 0.036, Q6_K 0.019, Q8_0 0.005).
RMS_BOUND = {"Q8_0": 0.01, "Q4_0": 0.12, "Q4_1": 0.11, "Q5_0": 0.06, "Q5_1": 0.055, "Q4_K": 0.085, "Q5_K": 0.045,
             "Q6_K": 0.025, "F16": 0.001, "BF16": 0.005}
TYPE_IDS = {**TYPES, "F16": 1, "BF16": 30}


def rows_for(rng: random.Random) -> list[list[float]]:
    """Gaussian rows at small, unit and large scales, one with an outlier and one
    with a zero block."""
    rows = [[rng.gauss(0.0, std) for _ in range(1024)] for std in (1e-3, 1.0, 300.0)]
    outlier = [rng.gauss(0.0, 1.0) for _ in range(1024)]
    outlier[500] = 40.0
    zero_block = [0.0 if 256 <= i < 288 else rng.gauss(0.0, 1.0) for i in range(1024)]
    return rows + [outlier, zero_block]


@pytest.mark.parametrize("name", list(RMS_BOUND))
def test_quantizer_round_trips_within_its_bound_by_the_formats_definition(name):
    rng = random.Random(7)
    for i, row in enumerate(rows_for(rng)):
        data = quantize(TYPE_IDS[name], row)
        assert len(data) == gw.row_bytes(TYPE_IDS[name], len(row))
        back = gw.dequantize(TYPE_IDS[name], data, len(row))  # the writer's independent decoder
        rms = math.sqrt(sum(x * x for x in row) / len(row))
        err = math.sqrt(sum((x - y) ** 2 for x, y in zip(row, back)) / len(row))
        if i < 3:  # the Gaussian rows
            assert err <= RMS_BOUND[name] * rms, (name, err / rms)
        for b in range(0, len(row), 32):
            amax = max(abs(x) for x in row[b:b + 32])
            worst = max(abs(x - y) for x, y in zip(row[b:b + 32], back[b:b + 32]))
            if name in BLOCK_BOUND:
                assert worst <= (BLOCK_BOUND[name] + 2 ** -9) * amax, (name, b, worst, amax)
            if amax == 0.0:
                assert worst == 0.0, (name, b)


def test_k_quant_scale_search_beats_one_scale_per_block():
    rng = random.Random(3)
    row = [rng.gauss(0.0, 1.0) for _ in range(4096)]

    def rms_error(type_id):
        back = gw.dequantize(type_id, quantize(type_id, row), len(row))
        return math.sqrt(sum((x - y) ** 2 for x, y in zip(row, back)) / len(row))

    # 4.5 bits per weight each: Q4_K's searched scales and mins against Q4_1's min/max.
    assert rms_error(TYPES["Q4_K"]) < 0.95 * rms_error(TYPES["Q4_1"])
    assert rms_error(TYPES["Q5_K"]) < 0.97 * rms_error(TYPES["Q5_1"])


def test_quantized_bytes_do_not_depend_on_threads_or_rows_per_call():
    rng = random.Random(5)
    rows, cols = 37, 512
    values = [rng.gauss(0.0, 1.0) for _ in range(rows * cols)]
    for type_id in (TYPES["Q4_K"], TYPES["Q6_K"], TYPES["Q8_0"]):
        whole = bytes(quantize_rows(F32, floats(values), rows, cols, type_id, 1))
        assert bytes(quantize_rows(F32, floats(values), rows, cols, type_id, 3)) == whole
        one_by_one = b"".join(quantize(type_id, values[r * cols:(r + 1) * cols]) for r in range(rows))
        assert one_by_one == whole


def test_requantizing_decodes_the_source_type_first():
    rng = random.Random(9)
    row = [rng.gauss(0.0, 1.0) for _ in range(256)]
    q8 = quantize(TYPES["Q8_0"], row)
    via_q8 = bytes(quantize_rows(TYPES["Q8_0"], q8, 1, 256, TYPES["Q4_K"], 1))
    assert via_q8 == quantize(TYPES["Q4_K"], gw.dequantize(TYPES["Q8_0"], q8, 256))


@pytest.mark.parametrize("src, dst, cols, values, message", [
    (F32, 10, 256, [0.0] * 256, "cannot quantize to type Q2_K"),
    (9, TYPES["Q8_0"], 32, None, "cannot read tensors of type Q8_1"),
    (F32, TYPES["Q4_K"], 96, [0.0] * 96, "96"),
    (F32, TYPES["Q8_0"], 64, [0.0] * 40 + [math.nan] + [0.0] * 23, "not finite"),
    (F32, TYPES["Q8_0"], 64, [0.0] * 64 + [math.inf] + [0.0] * 63, "row 1"),
])
def test_quantize_rows_refuses_with_a_reason(src, dst, cols, values, message):
    data = floats(values) if values is not None else bytes(36)
    rows = len(values) // cols if values is not None else 1
    with pytest.raises(EngineError) as exc:
        quantize_rows(src, data, rows, cols, dst)
    assert message in str(exc.value)


def test_quantize_rows_refuses_more_threads_than_an_engine_may_start():
    with pytest.raises(EngineError, match="at most 256"):
        quantize_rows(F32, floats([0.0] * 32), 1, 32, TYPES["Q8_0"], 100_000)
    assert quantize_rows(F32, floats([0.0] * 32), 1, 32, TYPES["Q8_0"], 256) == quantize(TYPES["Q8_0"], [0.0] * 32)


# ---- the mix table -------------------------------------------------------------------

@pytest.mark.parametrize("model", list(TINY_MODELS))
def test_mix_types_match_llama_quantize(model, tmp_path):
    h = header(write_tiny_model(model, tmp_path / "m.gguf"))
    arch = h.values["general.architecture"]
    golden = GOLDEN["mixes"][model]
    names = golden["tensors"].split()
    assert sorted(names) == sorted(t.name for t in h.tensors)
    for mix in MIXES:
        if mix not in golden:
            continue
        types = plan(h.tensors, MIXES[mix], arch, h.values[f"{arch}.block_count"],
                     h.values.get(f"{arch}.expert_count", 0), h.values[f"{arch}.attention.head_count"],
                     h.values[f"{arch}.attention.head_count_kv"])
        ours = {t.name: TYPE_NAMES[ty] for t, ty in zip(h.tensors, types)}
        theirs = dict(zip(names, golden[mix].split()))
        assert ours == theirs, (mix, {n: (ours[n], theirs[n]) for n in ours if ours[n] != theirs[n]})


def test_every_quantized_mix_has_a_golden_table():
    assert {m for m in MIXES if m not in ("F32", "F16", "BF16")} == set(GOLDEN["mixes"]["llama-64-tied"]) - {"tensors"}


# ---- the command ---------------------------------------------------------------------

def run(capsys, *args):
    code = cli.main(["quantize", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_quantize_writes_a_gguf_the_engine_runs(tmp_path, capsys):
    src = write_tiny_model("llama-256-untied", tmp_path / "in.gguf")
    dst = tmp_path / "out.gguf"
    code, out, err = run(capsys, src, dst, "Q4_K_M")
    assert (code, err) == (0, "")
    assert "wrote" in out
    before, after = header(src), header(dst)
    # metadata copied, the file type and quantization version set
    assert {k: v for k, v in after.values.items() if k not in ("general.file_type", "general.quantization_version")} \
        == {k: v for k, v in before.values.items() if k != "general.file_type"}
    assert after.values["general.file_type"] == 15 and after.values["general.quantization_version"] == 2
    assert [k for k, _ in after.kvs][:len(before.kvs)] == [k for k, _ in before.kvs]
    # tensors in the input's order, aligned, each one the engine's conversion of the input's
    assert [t.name for t in after.tensors] == [t.name for t in before.tensors]
    assert after.data_start % 32 == 0 and all(t.offset % 32 == 0 for t in after.tensors)
    data_in, data_out = src.read_bytes(), dst.read_bytes()
    for b, a in zip(before.tensors, after.tensors):
        size_in = gw.row_bytes(b.type, b.shape[0]) * b.rows
        size_out = gw.row_bytes(a.type, a.shape[0]) * a.rows
        raw_in = data_in[before.data_start + b.offset:][:size_in]
        raw_out = data_out[after.data_start + a.offset:][:size_out]
        expected = raw_in if a.type == b.type else bytes(quantize_rows(b.type, raw_in, b.rows, b.shape[0], a.type))
        assert raw_out == expected, a.name
    # ffn_down rows of 288: Q4_K falls back to Q5_0 and Q6_K to Q8_0
    assert {TYPE_NAMES[t.type] for t in after.tensors} == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # the engine loads it and its logits follow the F16 model's
    with Engine(str(src), n_ctx=64, max_sessions=1) as e16, Engine(str(dst), n_ctx=64, max_sessions=1) as eq:
        logits = []
        for e in (e16, eq):
            s = e.new_session()
            s.prefill([5, 17, 42, 99])
            logits.append(s.logits())
            s.close()
    n = len(logits[0])
    mean = [sum(v) / n for v in logits]
    cov = sum((x - mean[0]) * (y - mean[1]) for x, y in zip(*logits))
    var = [sum((x - m) ** 2 for x in v) for v, m in zip(logits, mean)]
    assert cov / math.sqrt(var[0] * var[1]) > 0.95


def test_quantize_keeps_the_files_alignment(tmp_path, capsys):
    w = gw.build_tiny_llama(n_embd=64, n_layer=1, n_ff=128, weight_type=gw.GGML_F16, alignment=256)
    src = w.write(tmp_path / "in.gguf")
    code, _, err = run(capsys, src, tmp_path / "out.gguf", "q8_0")
    assert (code, err) == (0, "")
    h = header(tmp_path / "out.gguf")
    assert h.alignment == 256 and h.data_start % 256 == 0 and all(t.offset % 256 == 0 for t in h.tensors)


def test_requantizing_needs_the_flag(tmp_path, capsys):
    src = write_tiny_model("llama-64-tied", tmp_path / "in.gguf")
    run(capsys, src, tmp_path / "q8.gguf", "Q8_0")
    code, _, err = run(capsys, tmp_path / "q8.gguf", tmp_path / "q4.gguf", "Q4_0")
    assert code == 2 and "--allow-requantize" in err and "Q8_0" in err
    assert not (tmp_path / "q4.gguf").exists()
    code, out, err = run(capsys, tmp_path / "q8.gguf", tmp_path / "q4.gguf", "Q4_0", "--allow-requantize")
    assert (code, err) == (0, "") and "requantizing" in out
    assert {TYPE_NAMES[t.type] for t in header(tmp_path / "q4.gguf").tensors} == {"F32", "Q4_0", "Q8_0"}


def corrupt_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = write_tiny_model("llama-64-tied", tmp_path / "good.gguf").read_bytes()
    files = {}

    def put(name: str, data: bytes, message: str) -> None:
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        files[name] = (path, message)

    put("empty", b"", "empty file")
    put("not_gguf", b"PK\x03\x04" + good[4:], "not a GGUF file")
    put("version_1", good[:4] + struct.pack("<I", 1) + good[8:], "version 1")
    put("truncated_header", good[:200], "truncated GGUF")
    put("truncated_data", good[:-100], "runs past the end of the file")
    put("huge_counts", good[:8] + struct.pack("<QQ", 1 << 60, 1 << 60) + good[24:], "cannot fit")
    w = gw.build_tiny_llama(n_embd=64, n_layer=1, n_ff=128, weight_type=gw.GGML_F16)
    w.tensor("blk.0.ffn_up.weight").ggml_type = 9  # Q8_1: GGUF sizes it, the engine cannot read it
    w.tensor("blk.0.ffn_up.weight").data = bytes(36 * 2 * 128)
    put("q8_1", w.to_bytes(), "cannot read tensors of type Q8_1 (blk.0.ffn_up.weight and 0 more)")
    for count in ("abc", float("nan"), float("inf")):
        w = gw.build_tiny_llama(n_embd=64, n_layer=1, n_ff=128)
        w.set("split.count", gw.STRING if isinstance(count, str) else gw.F32, count)
        put(f"split_count_{count}", w.to_bytes(), "split.count is")
    w = gw.build_tiny_llama(n_embd=64, n_layer=1, n_ff=128)
    w.tensor("blk.0.ffn_up.weight").ggml_type = 1 << 31  # past the engine's int32_t type numbers
    put("type_2p31", w.to_bytes(), "has type 2147483648, which GGUF does not define")
    return files


def test_bad_input_is_a_clear_error_with_exit_code_2(tmp_path, capsys):
    for name, (path, message) in corrupt_files(tmp_path).items():
        code, out, err = run(capsys, path, tmp_path / "out.gguf", "Q4_K_M")
        assert code == 2 and err.startswith("llmd: ") and message in err, (name, err)
        assert "Traceback" not in err and not (tmp_path / "out.gguf").exists(), name
    src = write_tiny_model("llama-64-tied", tmp_path / "in.gguf")
    for args, message in [((tmp_path / "missing.gguf", tmp_path / "o.gguf", "Q4_0"), "no such file"),
                          ((src, tmp_path / "o.gguf", "Q3_K_XL"), "unknown type 'Q3_K_XL'; known: F32, F16, BF16, Q8_0"),
                          ((src, tmp_path / "no" / "such" / "dir.gguf", "Q4_0"), "cannot write"),
                          ((src, src, "Q4_0"), "would overwrite the input")]:
        code, _, err = run(capsys, *args)
        assert code == 2 and message in err, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".gguf")) == []


def test_quantize_file_raises_quantize_error_not_a_traceback(tmp_path):
    with pytest.raises(QuantizeError, match="no such file"):
        quantize_file(str(tmp_path / "x.gguf"), str(tmp_path / "y.gguf"), "Q4_0")


def test_float_mixes_turn_every_matrix_into_that_float_type(tmp_path):
    h = header(write_tiny_model("llama-64-tied", tmp_path / "m.gguf"))
    for mix, want in (("F32", "F32"), ("F16", "F16"), ("BF16", "BF16")):
        types = plan(h.tensors, MIXES[mix], "llama", 2, 0, 4, 2)
        assert {t.name: TYPE_NAMES[ty] for t, ty in zip(h.tensors, types)} == \
            {t.name: "F32" if len(t.shape) == 1 else want for t in h.tensors}
