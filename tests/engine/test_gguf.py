"""The GGUF loader, through llmd.engine.native.Engine, on tiny files the tests write.

Valid files must load with the info they declare. Broken and hostile files must
fail with an EngineError whose message names the problem, and must never crash
the process: every hostile file is loaded in a child process (under a 1 GiB
address-space limit), so a segfault or an abort fails the test instead of
killing pytest, and a runaway allocation fails fast instead of swapping.
"""
from __future__ import annotations

import copy
import functools
import json
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmd._native import lib
from llmd.engine.native import CapacityError, Engine, EngineError
from tests.support.gguf_writer import (
    ARRAY, BOOL, F32, F64, GGML_F16, GGML_F32, GGML_IQ2_XXS, GGML_IQ4_XS, GGML_Q2_K, GGML_Q3_K, GGML_Q4_0,
    GGML_Q4_1, GGML_Q4_K, GGML_Q5_0, GGML_Q5_1, GGML_Q5_K, GGML_Q6_K, GGML_Q8_0, I8, I16, I32, I64, STRING,
    TYPE_NAMES,
    U8, U16, U32, U64, GGUFWriter, build_tiny_gpt_oss, build_tiny_llama, build_tiny_qwen35, encode_array_header,
    encode_f32,
)

ROOT = Path(__file__).resolve().parents[2]

FORMAT = lib.LLMD_ERR_FORMAT
UNSUPPORTED = lib.LLMD_ERR_UNSUPPORTED
# Model-level problems (a missing tensor, a mistyped hyperparameter) come back as
# UNSUPPORTED today; FORMAT would fit them as well, so either is accepted.
MODEL = (FORMAT, UNSUPPORTED)

# ---- loading in a child process -----------------------------------------------------

_LOADER = textwrap.dedent("""
    import json, resource, sys
    # AddressSanitizer reserves terabytes of address space up front, so under it the
    # cap cannot apply; CI's ASAN_OPTIONS (max_allocation_size_mb) bound allocations then.
    if "libasan" not in open("/proc/self/maps").read():
        limit = 1 << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from llmd.engine.native import Engine, EngineError
    probe = sys.argv[2] == "probe"
    for path in open(sys.argv[1]).read().splitlines():
        result = {"path": path}
        try:
            engine = Engine(path, n_threads=1, max_sessions=1)
        except EngineError as e:
            result.update(kind="error", status=e.status, cls=type(e).__name__, message=str(e))
        except BaseException as e:
            result.update(kind="other", cls=type(e).__name__, message=str(e))
        else:
            result.update(kind="ok")
            if probe:  # a file that loads must also run
                try:
                    session = engine.new_session()
                    session.prefill(engine.tokenize("hi there") or [0])
                    result["probe"] = [session.decode_one().id for _ in range(2)]
                except EngineError as e:
                    result["probe_error"] = str(e)
                except BaseException as e:
                    result.update(kind="other", cls=type(e).__name__, message=str(e))
            engine.close()
        print(json.dumps(result), flush=True)
""")


def load_in_child(paths: list[Path], *, probe: bool = False, timeout: float = 60) -> list[dict]:
    """One result per path: kind "ok", "error" (an EngineError: status, cls,
    message), "other" (any other exception) or "crash" (the child died first)."""
    manifest = paths[0].parent / "manifest.txt"
    manifest.write_text("\n".join(str(p) for p in paths))
    proc = subprocess.run([sys.executable, "-c", _LOADER, str(manifest), "probe" if probe else "load"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    for path in paths[len(results):]:
        results.append({"path": str(path), "kind": "crash", "returncode": proc.returncode,
                        "stderr": proc.stderr[-2000:]})
    return results


def write_cases(directory: Path, cases: dict[str, bytes]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in cases.items():
        path = directory / f"{name}.gguf"
        path.write_bytes(data)
        paths.append(path)
    return paths


# ---- a small valid file to break -----------------------------------------------------

SMALL = dict(n_vocab=280, n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=32, n_ctx=64, seed=3)


@functools.lru_cache(maxsize=None)
def _small_writer() -> GGUFWriter:
    return build_tiny_llama(**SMALL)


def small() -> GGUFWriter:
    """A fresh copy of a valid small model's writer, ready to be broken."""
    return copy.deepcopy(_small_writer())


def small_bytes() -> bytes:
    return small().to_bytes()


def patched(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


def edit(fn):
    """A case from a function that breaks a small model's writer in place."""
    def make() -> bytes:
        w = small()
        fn(w)
        return w.to_bytes()
    return make


def _set(key, vtype, value):
    return edit(lambda w: w.set(key, vtype, value))


def _raw(key, vtype, raw):
    def apply(w: GGUFWriter):
        w.remove(key)
        w.append(key, vtype, None, raw=raw)
    return edit(apply)


def _tensor(tensor_name, **changes):
    def apply(w: GGUFWriter):
        t = w.tensor(tensor_name)
        for k, v in changes.items():
            setattr(t, k, v)
    return edit(apply)


def _key_length(value: int):
    def make() -> bytes:
        w = small()
        data = w.to_bytes()
        return patched(data, w.layout.kv_offsets[0], struct.pack("<Q", value))
    return make


def _tensor_name_length(value: int):
    def make() -> bytes:
        w = small()
        data = w.to_bytes()
        return patched(data, w.layout.tensor_info_offsets[0], struct.pack("<Q", value))
    return make


def _header(**fields):
    def make() -> bytes:
        data = small_bytes()
        magic = fields.get("magic", data[:4])
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
        header = magic + struct.pack("<IQQ", fields.get("version", version),
                                     fields.get("n_tensors", n_tensors), fields.get("n_kv", n_kv))
        return header + data[len(header):]
    return make


def _nested(levels: int):
    value = (U8, [1, 2])
    for _ in range(levels):
        value = (ARRAY, [value])
    return value


def _deep_nesting(w: GGUFWriter):
    elem_type, items = _nested(7)
    w.set("test.deep", ARRAY, (elem_type, items))


def _add_duplicate_tensor(w: GGUFWriter):
    t = w.tensor("output_norm.weight")
    w.add_tensor(t.name, t.ne, t.ggml_type, t.data)


def _drop_last_token(w: GGUFWriter):
    tokens = w.get("tokenizer.ggml.tokens").value[1][:-1]
    types = w.get("tokenizer.ggml.token_type").value[1][:-1]
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    w.set("tokenizer.ggml.token_type", ARRAY, (I32, types))
    w.set("tokenizer.ggml.eos_token_id", U32, 1)


def _duplicate_token(w: GGUFWriter):
    tokens = list(w.get("tokenizer.ggml.tokens").value[1])
    tokens[-1] = tokens[-2]
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))


def _token_type(index: int, value: int):
    def apply(w: GGUFWriter):
        types = list(w.get("tokenizer.ggml.token_type").value[1])
        types[index] = value
        w.set("tokenizer.ggml.token_type", ARRAY, (I32, types))
    return edit(apply)


def _shift_last_tensor_offset(w: GGUFWriter):
    w.to_bytes()
    last = w.tensors[-1]
    last.offset = w.layout.tensor_offsets[last.name] - w.layout.data_start + 32


HUGE = 1 << 63

# name -> (make bytes, accepted statuses, text the message must contain)
HOSTILE = {
    # header
    "empty_file": (lambda: b"", (FORMAT,), "is empty"),
    "only_magic": (lambda: b"GGUF", (FORMAT,), "truncated while reading version"),
    "bad_magic": (_header(magic=b"GGUX"), (FORMAT,), "bad magic"),
    "ggml_magic": (_header(magic=b"lmgg"), (FORMAT,), "bad magic"),
    "version_1": (_header(version=1), (FORMAT,), "unsupported GGUF version 1"),
    "version_4": (_header(version=4), (FORMAT,), "unsupported GGUF version 4"),
    "n_kv_2_63": (_header(n_kv=HUGE), (FORMAT,), f"metadata count {HUGE} exceeds the file"),
    "n_kv_max": (_header(n_kv=2**64 - 1), (FORMAT,), "metadata count"),
    "n_tensors_2_63": (_header(n_tensors=HUGE), (FORMAT,), f"tensor count {HUGE} exceeds the file"),
    "n_kv_one_too_many": (_header(n_kv=len(_small_writer().kvs) + 1), (FORMAT,), "GGUF:"),
    "n_tensors_one_too_many": (_header(n_tensors=len(_small_writer().tensors) + 1), (FORMAT,), "GGUF:"),
    # metadata
    "key_length_2_63": (_key_length(HUGE), (FORMAT,), f"metadata key length {HUGE} exceeds the file"),
    "key_length_max": (_key_length(2**64 - 1), (FORMAT,), "metadata key length"),
    "empty_key": (edit(lambda w: w.append("", U8, 1)), (FORMAT,), "empty metadata key"),
    "string_length_2_63": (_raw("general.name", STRING, struct.pack("<Q", HUGE) + b"x"), (FORMAT,),
                           f"string value length {HUGE} exceeds the file"),
    "string_array_count_2_63": (_raw("tokenizer.ggml.tokens", ARRAY, encode_array_header(STRING, HUGE)),
                                (FORMAT,), "string array tokenizer.ggml.tokens count exceeds the file"),
    "int_array_count_2_63": (_raw("tokenizer.ggml.token_type", ARRAY, encode_array_header(I32, HUGE)),
                             (FORMAT,), f"array of {HUGE} elements exceeds the file"),
    "u8_array_count_max": (_raw("test.bytes", ARRAY, encode_array_header(U8, 2**64 - 1)),
                           (FORMAT,), "elements exceeds the file"),
    "nested_array_count_2_63": (_raw("test.nested", ARRAY, encode_array_header(ARRAY, HUGE)),
                                (FORMAT,), f"array of {HUGE} elements exceeds the file"),
    "arrays_nested_too_deeply": (edit(_deep_nesting), (FORMAT,), "arrays nested too deeply"),
    "unknown_value_type": (_raw("test.bad", 13, b"\0" * 8), (FORMAT,), "unknown value type 13 for key test.bad"),
    "unknown_array_element_type": (_raw("test.bad", ARRAY, encode_array_header(13, 1) + b"\0" * 8),
                                   (FORMAT,), "unknown array element type 13"),
    "duplicate_key": (edit(lambda w: w.append("general.name", STRING, "again")), (FORMAT,),
                      "duplicate metadata key general.name"),
    "alignment_0": (_set("general.alignment", U32, 0), (FORMAT,), "general.alignment 0 is not a power of two"),
    "alignment_3": (_set("general.alignment", U32, 3), (FORMAT,), "general.alignment 3 is not a power of two"),
    "alignment_2_21": (_set("general.alignment", U64, 1 << 21), (FORMAT,), "is not a power of two"),
    "alignment_negative": (_set("general.alignment", I32, -8), (FORMAT,), "general.alignment -8"),
    "alignment_string": (_set("general.alignment", STRING, "32"), (FORMAT,),
                         "general.alignment has a non-integer type"),
    # tensor infos
    "tensor_name_length_2_63": (_tensor_name_length(HUGE), (FORMAT,), f"tensor name length {HUGE} exceeds the file"),
    "empty_tensor_name": (_tensor("output_norm.weight", name=""), (FORMAT,), "empty tensor name"),
    "duplicate_tensor": (edit(_add_duplicate_tensor), (FORMAT,), "duplicate tensor output_norm.weight"),
    "n_dims_0": (_tensor("output_norm.weight", ne=[]), (FORMAT,), "output_norm.weight has 0 dimensions"),
    "n_dims_5": (_tensor("token_embd.weight", ne=[32, 280, 1, 1, 1]), (FORMAT,),
                 "token_embd.weight has 5 dimensions"),
    "zero_dim": (_tensor("token_embd.weight", ne=[32, 0]), (FORMAT,), "token_embd.weight has an invalid shape"),
    "dim_2_63": (_tensor("token_embd.weight", ne=[HUGE, 1]), (FORMAT,), "invalid shape"),
    "shape_product_overflow": (_tensor("token_embd.weight", ne=[2**32, 2**32]), (FORMAT,), "invalid shape"),
    "shape_product_wraps_to_small": (_tensor("token_embd.weight", ne=[2**32, 2**32, 2**32, 2**32]),
                                     (FORMAT,), "invalid shape"),
    "unknown_tensor_type": (_tensor("token_embd.weight", ggml_type=99), (FORMAT,),
                            "token_embd.weight has unknown type 99"),
    "retired_tensor_type": (_tensor("token_embd.weight", ggml_type=4), (FORMAT,),
                            "token_embd.weight has unknown type 4"),
    "row_not_whole_blocks": (_tensor("token_embd.weight", ggml_type=GGML_Q8_0, ne=[48, 280]), (FORMAT,),
                             "row is not a whole number of Q8_0 blocks"),
    "row_not_whole_k_blocks": (_tensor("token_embd.weight", ggml_type=GGML_Q4_K, ne=[32, 280]), (FORMAT,),
                               "row is not a whole number of Q4_K blocks"),
    "offset_misaligned": (_tensor("token_embd.weight", offset=4), (FORMAT,),
                          "token_embd.weight offset is not aligned"),
    "offset_past_end": (_tensor("token_embd.weight", offset=1 << 40), (FORMAT,),
                        "token_embd.weight data lies outside the file"),
    "offset_near_2_64": (_tensor("token_embd.weight", offset=2**64 - 32), (FORMAT,), "data lies outside the file"),
    "last_tensor_runs_past_end": (edit(_shift_last_tensor_offset), (FORMAT,), "data lies outside the file"),
    "tensors_share_bytes": (edit(lambda w: [setattr(t, "offset", 0) for t in w.tensors]), (FORMAT,),
                            "share bytes of the file"),
    # model metadata
    "architecture_missing": (edit(lambda w: w.remove("general.architecture")), MODEL,
                             "lacks general.architecture"),
    "architecture_not_string": (_set("general.architecture", U32, 1), MODEL,
                                "general.architecture should be a string"),
    "architecture_gpt2": (_set("general.architecture", STRING, "gpt2"), MODEL,
                          "unsupported architecture 'gpt2' (llmd runs llama"),
    "block_count_string": (_set("llama.block_count", STRING, "1"), MODEL, "llama.block_count should be an integer"),
    "block_count_array": (_set("llama.block_count", ARRAY, (U32, [1])), MODEL, "llama.block_count should be an integer"),
    "block_count_negative": (_set("llama.block_count", I32, -1), MODEL, "llama.block_count = -1 is out of range"),
    "block_count_2_31": (_set("llama.block_count", U32, 2**31), MODEL, "is out of range"),
    "block_count_0": (_set("llama.block_count", U32, 0), MODEL, "llama.block_count = 0: the model has no layers"),
    "embedding_length_missing": (edit(lambda w: w.remove("llama.embedding_length")), MODEL,
                                 "lacks llama.embedding_length"),
    "head_count_0": (_set("llama.attention.head_count", U32, 0), MODEL, "inconsistent"),
    "head_count_kv_not_divisor": (_set("llama.attention.head_count_kv", U32, 3), MODEL, "inconsistent"),
    "freq_base_string": (_set("llama.rope.freq_base", STRING, "1e4"), MODEL, "llama.rope.freq_base should be a number"),
    "norm_eps_zero": (_set("llama.attention.layer_norm_rms_epsilon", F32, 0.0), MODEL, "norm epsilon is invalid"),
    "norm_eps_inf": (_set("llama.attention.layer_norm_rms_epsilon", F32, float("inf")), MODEL,
                     "llama.attention.layer_norm_rms_epsilon = inf is out of range"),
    "norm_eps_2": (_set("llama.attention.layer_norm_rms_epsilon", F32, 2.0), MODEL, "norm epsilon is invalid"),
    "rope_dim_odd": (_set("llama.rope.dimension_count", U32, 7), MODEL, "RoPE dimensions are inconsistent"),
    "rope_scaling_dynamic": (_set("llama.rope.scaling.type", STRING, "dynamic"), MODEL,
                             "unsupported RoPE scaling 'dynamic' (llmd runs none, linear, yarn, longrope)"),
    "rope_freqs_and_longrope": (edit(lambda w: [w.add_tensor(n, [8], GGML_F32, encode_f32([1] * 8))
                                                for n in ("rope_freqs.weight", "rope_factors_long.weight")]),
                                MODEL, "both rope_freqs and LongRoPE factors"),
    "rope_scaling_factor_negative": (_set("llama.rope.scaling.factor", F32, -2.0), MODEL,
                                     "RoPE scaling factor is invalid"),
    "rope_scaling_factor_tiny": (_set("llama.rope.scaling.factor", F32, 1e-38), MODEL,
                                 "llama.rope.scaling.factor = 1e-38 is out of range"),
    "rope_scaling_factor_5000": (_set("llama.rope.scaling.factor", F32, 5000.0), MODEL,
                                 "RoPE scaling factor is invalid"),
    "rope_scaling_attn_factor_huge": (_set("llama.rope.scaling.attn_factor", F32, 3e38), MODEL,
                                      "llama.rope.scaling.attn_factor = 3e+38 is out of range"),
    "rope_scaling_type_not_string": (_set("llama.rope.scaling.type", U32, 1), MODEL,
                                     "llama.rope.scaling.type should be a string"),
    # model tensors
    "token_embd_missing": (edit(lambda w: w.remove_tensor("token_embd.weight")), MODEL,
                           "lacks tensor token_embd.weight"),
    "output_norm_missing": (edit(lambda w: w.remove_tensor("output_norm.weight")), MODEL,
                            "lacks tensor output_norm.weight"),
    "ffn_down_missing": (edit(lambda w: w.remove_tensor("blk.0.ffn_down.weight")), MODEL,
                         "lacks tensor blk.0.ffn_down.weight"),
    "attn_q_shape": (_tensor("blk.0.attn_q.weight", ne=[32, 16]), MODEL,
                     "blk.0.attn_q.weight has shape [32, 16], expected [32, 32]"),
    "attn_k_one_dim": (_tensor("blk.0.attn_k.weight", ne=[512]), MODEL, "blk.0.attn_k.weight has shape"),
    "norm_not_f32": (_tensor("blk.0.ffn_norm.weight", ggml_type=GGML_F16), MODEL,
                     "blk.0.ffn_norm.weight should be F32 of 32 elements"),
    "vocab_disagrees_with_embedding": (edit(_drop_last_token), MODEL,
                                       "token_embd.weight has shape [32, 280], expected [32, 279]"),
    "rope_freqs_wrong_shape": (edit(lambda w: w.add_tensor("rope_freqs.weight", [3], GGML_F32, encode_f32([1] * 3))),
                               MODEL, "rope_freqs.weight has the wrong type or shape"),
    "rope_freqs_zero_factor": (edit(lambda w: w.add_tensor("rope_freqs.weight", [8], GGML_F32, encode_f32([0] * 8))),
                               MODEL, "holds a factor out of range"),
    "rope_freqs_subnormal_factor": (edit(lambda w: w.add_tensor("rope_freqs.weight", [8], GGML_F32,
                                                                encode_f32([1e-45] * 8))),
                                    MODEL, "holds a factor out of range"),
    "rope_freq_base_subnormal": (_set("llama.rope.freq_base", F32, 1e-40), MODEL,
                                 "llama.rope.freq_base = 9.99995e-41 is out of range"),
    "tensor_unused": (edit(lambda w: w.add_tensor("blk.0.ssm_in.weight", [32, 64], GGML_F32, encode_f32([0] * 2048))),
                      MODEL, "model has tensor blk.0.ssm_in.weight, which the llama architecture does not use"),
    # llama.cpp reads a fused attn_qkv instead of attn_q, attn_k and attn_v, never beside them
    "attn_qkv_beside_q_k_v": (edit(lambda w: w.add_tensor("blk.0.attn_qkv.weight", [32, 64], GGML_F32,
                                                          encode_f32([0] * 2048))),
                              MODEL, "model has tensor blk.0.attn_q.weight, which the llama architecture does not use"),
    "attn_qkv_wrong_shape": (edit(lambda w: w.add_tensor("blk.0.attn_qkv.weight", [32, 48], GGML_F32,
                                                         encode_f32([0] * 1536))),
                             MODEL, "tensor blk.0.attn_qkv.weight has shape [32, 48], expected [32, 64]"),
    "bias_wrong_shape": (edit(lambda w: w.add_tensor("blk.0.attn_k.bias", [32], GGML_F32, encode_f32([0] * 32))),
                         MODEL, "blk.0.attn_k.bias should be F32 of 16 elements"),
    # tokenizer
    "tokenizer_model_bert": (_set("tokenizer.ggml.model", STRING, "bert"), (UNSUPPORTED,),
                             "unsupported tokenizer model 'bert' (WordPiece)"),
    "tokenizer_model_missing": (edit(lambda w: w.remove("tokenizer.ggml.model")), (FORMAT,),
                                "tokenizer.ggml.model is missing"),
    "tokenizer_model_not_string": (_set("tokenizer.ggml.model", U32, 2), (FORMAT,),
                                   "tokenizer.ggml.model should be a string"),
    "tokenizer_pre_unknown": (_set("tokenizer.ggml.pre", STRING, "qwen9"), (UNSUPPORTED,),
                              "unsupported pre-tokenizer 'qwen9' (supported: llama3 "),
    "token_scores_short": (_set("tokenizer.ggml.scores", ARRAY, (F32, [0.0, 0.0])), (FORMAT,),
                           "tokenizer.ggml.scores does not match the tokens"),
    "tokens_missing": (edit(lambda w: w.remove("tokenizer.ggml.tokens")), (FORMAT,),
                       "tokenizer.ggml.tokens is missing"),
    "tokens_empty": (_set("tokenizer.ggml.tokens", ARRAY, (STRING, [])), (FORMAT,), "tokenizer.ggml.tokens"),
    "tokens_not_strings": (_set("tokenizer.ggml.tokens", ARRAY, (U32, [1, 2])), (FORMAT,),
                           "not a string array"),
    "token_types_short": (_set("tokenizer.ggml.token_type", ARRAY, (I32, [1, 1])), (FORMAT,),
                          "token_type does not match"),
    "token_type_unknown": (_token_type(5, 9), (UNSUPPORTED,), "token 5 has unknown type 9"),
    "merge_of_unknown_tokens": (_set("tokenizer.ggml.merges", ARRAY, (STRING, ["zz qq"])), (UNSUPPORTED,),
                                "merge 0 'zz qq' is not two known tokens"),
    "merges_not_strings": (_set("tokenizer.ggml.merges", ARRAY, (I32, [1])), (FORMAT,),
                           "tokenizer.ggml.merges is not a string array"),
    "duplicate_token": (edit(_duplicate_token), (UNSUPPORTED,), "duplicates token"),
}


@pytest.fixture(scope="module")
def hostile_results(tmp_path_factory) -> dict[str, dict]:
    directory = tmp_path_factory.mktemp("hostile")
    paths = write_cases(directory, {name: make() for name, (make, _, _) in HOSTILE.items()})
    return dict(zip(HOSTILE, load_in_child(paths, probe=True)))


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_file_fails_with_an_error_naming_the_problem(case, hostile_results):
    _, statuses, text = HOSTILE[case]
    result = hostile_results[case]
    assert result["kind"] == "error", result
    assert result["status"] in statuses, result
    assert text in result["message"], result


# ---- valid files -----------------------------------------------------------------------

def test_tiny_model_info_is_what_the_file_declares(tiny_model):
    m = tiny_model
    with Engine(m.path, n_threads=2, max_sessions=4) as engine:
        info = engine.info
        assert (info.architecture, info.name, info.tokenizer_pre) == ("llama", m.name, "smollm")
        assert info.chat_template == m.chat_template
        assert (info.n_ctx_train, info.n_ctx) == (m.n_ctx, m.n_ctx)
        assert (info.n_vocab, info.n_embd, info.n_layer) == (m.n_vocab, m.n_embd, m.n_layer)
        assert (info.n_head, info.n_head_kv, info.n_threads) == (m.n_head, m.n_head_kv, 2)
        assert (info.bos_id, info.eos_id, info.add_bos) == (m.im_start_id, m.im_end_id, False)
        # EOS and the other end-of-turn tokens the vocabulary has, in id order (a set, as llama.cpp keeps it).
        assert info.eog_ids == tuple(sorted((m.im_end_id, m.endoftext_id)))
        assert info.weight_bytes == m.weight_bytes
        assert info.kv_bytes_per_token == 2 * m.n_layer * m.kv_dim * 2
        assert info.bytes_per_session == info.kv_bytes_per_token * m.n_ctx + m.n_vocab * 4
        assert info.max_sessions == 4


def test_n_ctx_option_sets_the_context_per_session(tiny_model):
    with Engine(tiny_model.path, n_threads=1, n_ctx=32, max_sessions=1) as engine:
        assert (engine.info.n_ctx_train, engine.info.n_ctx) == (tiny_model.n_ctx, 32)
        assert engine.info.bytes_per_session == engine.info.kv_bytes_per_token * 32 + tiny_model.n_vocab * 4


def test_kv_budget_bounds_max_sessions(tiny_model):
    with Engine(tiny_model.path, n_threads=1, max_sessions=1) as probe:
        per = probe.info.bytes_per_session
    with Engine(tiny_model.path, n_threads=1, kv_budget_bytes=3 * per + per // 2) as engine:
        assert engine.info.max_sessions == 3
        assert engine.capacity(5 * per) == (5, per)
        assert engine.capacity(per - 1) == (0, per)
    # An explicit max_sessions wins over the budget.
    with Engine(tiny_model.path, n_threads=1, max_sessions=7, kv_budget_bytes=per) as engine:
        assert engine.info.max_sessions == 7


def test_a_quantized_kv_cache_costs_its_bytes_and_a_budget_admits_more_sessions(tiny_llama_factory):
    """Bytes per position follow the KV types (per 32 values: 64 bytes f16, 34 q8_0,
    18 q4_0, keys and values each), and so do a session's bytes and the sessions a
    budget admits."""
    m = tiny_llama_factory(n_embd=128, n_head=4, n_head_kv=2)  # heads of 32
    rows = m.n_layer * m.n_head_kv  # rows of 32 values per position, keys and values each
    budget = 40 * 2 * rows * 64 * m.n_ctx
    infos = {}
    for k, v in (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")):
        with Engine(m.path, n_threads=1, kv_budget_bytes=budget, kv_type_k=k, kv_type_v=v) as engine:
            infos[k, v] = info = engine.info
            assert (info.kv_type_k, info.kv_type_v) == (k, v)
            assert info.bytes_per_session == info.kv_bytes_per_token * m.n_ctx + m.n_vocab * 4
            assert info.kv_block_bytes == info.kv_block_positions * info.kv_bytes_per_token
    per_value = {"f16": 64, "q8_0": 34, "q4_0": 18}
    for (k, v), info in infos.items():
        assert info.kv_bytes_per_token == rows * (per_value[k] + per_value[v])
    assert infos["q8_0", "q8_0"].max_sessions > 1.8 * infos["f16", "f16"].max_sessions
    assert infos["q4_0", "q4_0"].max_sessions > 3.2 * infos["f16", "f16"].max_sessions


def test_an_unknown_kv_type_or_one_the_heads_cannot_take_is_refused_at_open(tiny_model):
    with pytest.raises(EngineError, match=r"unknown KV type 'q5_0' for keys \(allowed: f16, q8_0, q4_0\)") as err:
        Engine(tiny_model.path, kv_type_k="q5_0")
    assert err.value.status == lib.LLMD_ERR_INVALID_ARGUMENT
    with pytest.raises(EngineError, match="unknown KV type 'Q8_0' for values"):
        Engine(tiny_model.path, kv_type_v="Q8_0")
    # The default tiny model's heads hold 16 values: no whole block of 32.
    with pytest.raises(EngineError, match="KV type q8_0: .*multiple of 32; this model's is 16 .allowed here: f16.") as err:
        Engine(tiny_model.path, kv_type_k="q8_0", kv_type_v="q8_0")
    assert err.value.status == lib.LLMD_ERR_UNSUPPORTED


def test_kv_budget_below_one_session_is_a_capacity_error(tiny_model):
    with pytest.raises(CapacityError, match="does not fit one session"):
        Engine(tiny_model.path, n_threads=1, kv_budget_bytes=1000)


def test_negative_options_are_invalid_arguments(tiny_model):
    for options in ({"n_ctx": -1}, {"n_threads": -1}, {"max_sessions": -1}):
        with pytest.raises(EngineError, match="must not be negative") as err:
            Engine(tiny_model.path, **options)
        assert err.value.status == lib.LLMD_ERR_INVALID_ARGUMENT


def test_missing_file_is_an_io_error_naming_the_path(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(EngineError, match="cannot open .*nope.gguf.*No such file") as err:
        Engine(path)
    assert err.value.status == lib.LLMD_ERR_IO


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(EngineError, match="is not a regular file"):
        Engine(tmp_path)


def first_logits(path: Path) -> list[float]:
    with Engine(path, n_threads=1, max_sessions=1) as engine:
        session = engine.new_session()
        session.prefill(engine.tokenize("the quick brown fox"))
        return session.logits()


@pytest.mark.parametrize("alignment", [8, 64, 4096, None])
def test_alignment_is_honoured_and_does_not_change_the_model(alignment, tmp_path):
    reference = build_tiny_llama(**SMALL).write(tmp_path / "a32.gguf")
    w = build_tiny_llama(**SMALL, alignment=alignment)
    path = w.write(tmp_path / "other.gguf")
    step = alignment or 32  # no general.alignment key: GGUF's default of 32
    assert all((off - w.layout.data_start) % step == 0 for off in w.layout.tensor_offsets.values())
    assert w.layout.data_start % step == 0
    assert first_logits(path) == first_logits(reference)


def test_gguf_version_2_loads(tmp_path):
    w = small()
    w.version = 2
    with Engine(w.write(tmp_path / "v2.gguf"), n_threads=1, max_sessions=1) as engine:
        assert engine.info.n_vocab == SMALL["n_vocab"]


def test_metadata_of_every_value_type_is_read_past(tmp_path):
    extra = [
        ("test.u8", U8, 255), ("test.i8", I8, -128), ("test.u16", U16, 65535), ("test.i16", I16, -32768),
        ("test.u32", U32, 2**32 - 1), ("test.i32", I32, -2**31), ("test.u64", U64, 2**64 - 1),
        ("test.i64", I64, -2**63), ("test.f32", F32, 1.5), ("test.f64", F64, -2.25),
        ("test.bool", BOOL, True), ("test.string", STRING, "héllo"), ("test.empty_string", STRING, ""),
        ("test.f64s", ARRAY, (F64, [1.0, 2.0])), ("test.bools", ARRAY, (BOOL, [True, False])),
        ("test.strings", ARRAY, (STRING, ["a", "", "ccc"])), ("test.empty", ARRAY, (U8, [])),
        ("test.nested", ARRAY, _nested(3)),
        ("test.nested_strings", ARRAY, (ARRAY, [(STRING, ["x", "y"]), (STRING, [])])),
    ]
    w = build_tiny_llama(**SMALL, extra_metadata=extra)
    with Engine(w.write(tmp_path / "extra.gguf"), n_threads=1, max_sessions=1) as engine:
        assert engine.info.n_vocab == SMALL["n_vocab"]
        assert engine.info.name == "tiny-llama"


def test_general_name_is_optional(tmp_path):
    w = small()
    w.remove("general.name")
    w.remove("tokenizer.chat_template")
    with Engine(w.write(tmp_path / "anon.gguf"), n_threads=1, max_sessions=1) as engine:
        assert (engine.info.name, engine.info.chat_template) == ("", "")


def test_untied_output_head_is_used(tmp_path):
    tied = build_tiny_llama(**SMALL).write(tmp_path / "tied.gguf")
    untied_writer = build_tiny_llama(**SMALL, tied=False)
    untied = untied_writer.write(tmp_path / "untied.gguf")
    with Engine(untied, n_threads=1, max_sessions=1) as engine:
        assert engine.info.weight_bytes == sum(len(t.data) for t in untied_writer.tensors)
    assert first_logits(untied) != first_logits(tied)


def _retyped(w: GGUFWriter, names: list[str], ggml_type: int, block_bytes: int) -> None:
    """Gives the tensors a type of 256-element blocks (random bytes of the right size)."""
    for name in names:
        t = w.tensor(name)
        t.ggml_type = ggml_type
        t.data = random.Random(name).randbytes(t.ne[0] * t.ne[1] // 256 * block_bytes)


def test_types_without_kernels_are_refused_naming_every_tensor_by_type(tmp_path):
    w = build_tiny_llama(n_vocab=280, n_embd=256, n_layer=3, n_head=4, n_head_kv=2, n_ff=256, n_ctx=64)
    _retyped(w, [f"blk.{l}.attn_q.weight" for l in range(3)], GGML_IQ2_XXS, 66)
    _retyped(w, ["blk.1.ffn_up.weight"], 15, 292)  # Q8_K: activations only, never weights
    with pytest.raises(EngineError) as e:
        Engine(w.write(tmp_path / "iq2.gguf"), n_threads=1, max_sessions=1)
    assert e.value.status == UNSUPPORTED
    assert str(e.value) == ("the engine has no kernels for tensor type IQ2_XXS (blk.0.attn_q.weight and 2 more), "
                            "Q8_K (blk.1.ffn_up.weight)")


# The kernel variants that keep quantized matrices as repacked panels (the others
# keep the file's rows).
REPACKING_VARIANTS = {"avx2", "avx-vnni", "avx512"}

# Bytes of the packed form of 16 rows × 256 columns (native/src/quants/quants.h PanelLayout): for
# the K-quants each row's f16 d (and m) once, then 8 panel-blocks of 16 × 32 weights
# at the type's own bits and each row's int8 scales (and mins): Q4_K 64 + 8 * (256 +
# 32). Next to the file's 16 rows of the type: the same size for Q6_K, Q5_0 and Q5_1,
# a little more where the file packs scales tighter than a byte.
PACKED_16x256 = {GGML_Q4_K: (2368, 16 * 144), GGML_Q6_K: (32 + 8 * (384 + 32), 16 * 210),
                 GGML_Q5_K: (64 + 8 * (320 + 32), 16 * 176), GGML_Q3_K: (32 + 8 * (192 + 32), 16 * 110),
                 GGML_Q2_K: (64 + 8 * (128 + 64), 16 * 84), GGML_IQ4_XS: (32 + 8 * (256 + 16), 16 * 136),
                 GGML_Q5_0: (8 * (320 + 32), 16 * 8 * 22), GGML_Q5_1: (8 * (320 + 64), 16 * 8 * 24)}


@pytest.mark.parametrize("weight_type", list(PACKED_16x256), ids=lambda t: TYPE_NAMES[t])
def test_packed_models_count_their_packed_bytes_near_the_file_size(weight_type, tmp_path):
    w = build_tiny_llama(n_vocab=280, n_embd=256, n_layer=1, n_head=4, n_head_kv=2, n_ff=256, n_ctx=64,
                         weight_type=weight_type)
    packed, file = PACKED_16x256[weight_type]
    assert packed <= 1.2 * file  # native size, or close
    with Engine(w.write(tmp_path / "k.gguf"), n_threads=1, max_sessions=1) as engine:
        expected = sum(len(t.data) for t in w.tensors)
        if engine.info.kernels in REPACKING_VARIANTS:
            # Packed forms replace the originals, rows padded to whole 16-row panels.
            expected += sum(-(-t.ne[1] // 16) * t.ne[0] // 256 * packed - len(t.data)
                            for t in w.tensors if len(t.ne) == 2)
        assert engine.info.weight_bytes == expected


@pytest.mark.parametrize("weight_type", [GGML_F16, GGML_Q8_0, GGML_Q4_0])
def test_quantized_models_load_with_their_tensor_bytes(weight_type, tmp_path):
    w = build_tiny_llama(**SMALL, weight_type=weight_type)
    with Engine(w.write(tmp_path / "q.gguf"), n_threads=1, max_sessions=1) as engine:
        expected = sum(len(t.data) for t in w.tensors)
        if engine.info.kernels in REPACKING_VARIANTS:
            # Packed matrices replace their originals, rows padded to whole 16-row panels
            # (the output head is the embedding when the model ties them).
            tied = all(t.name != "output.weight" for t in w.tensors)
            expected += sum((-t.ne[1] % 16) * len(t.data) // t.ne[1] for t in w.tensors
                            if len(t.ne) == 2 and t.ggml_type in (GGML_Q4_0, GGML_Q4_1, GGML_Q8_0)
                            and (tied or t.name != "token_embd.weight"))
        assert engine.info.weight_bytes == expected


# ---- truncation and byte flips ----------------------------------------------------------

def test_every_truncation_fails_with_a_format_error(tmp_path):
    w = small()
    data = w.to_bytes()
    cuts = sorted(set(range(0, w.layout.data_start + 40, 7))
                  | {w.layout.infos_end - 1, w.layout.data_start}
                  | set(range(w.layout.data_start + 1, len(data), 2011)) | {len(data) - 1})
    paths = write_cases(tmp_path, {f"cut_{n:06d}": data[:n] for n in cuts})
    results = load_in_child(paths)
    bad = [(n, r) for n, r in zip(cuts, results)
           if not (r["kind"] == "error" and r["status"] == FORMAT and
                   (r["message"].startswith("GGUF: ") or r["message"].endswith("is empty")))]
    assert len(cuts) > 800
    assert not bad, bad[:5]


def test_random_header_byte_flips_load_or_fail_cleanly(tmp_path):
    w = small()
    data = w.to_bytes()
    rng = random.Random(20240607)
    cases = {}
    for i in range(400):
        flipped = bytearray(data)
        # Half the variants hit the fixed header and the first keys, where counts live.
        end = 64 if i % 2 else w.layout.infos_end
        for _ in range(rng.randint(1, 3)):
            flipped[rng.randrange(end)] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
        cases[f"flip_{i:03d}"] = bytes(flipped)
    results = load_in_child(write_cases(tmp_path, cases), probe=True)
    bad = [r for r in results if r["kind"] not in ("ok", "error") or (r["kind"] == "error" and not r["message"])]
    assert not bad, bad[:5]
    kinds = {r["kind"] for r in results}
    assert kinds == {"ok", "error"}  # the variants exercise both paths


# ---- hostile sizes that once exhausted memory or hung the thread pool ---------------------

def test_huge_block_count_fails_by_naming_the_missing_layer(tmp_path):
    w = small()
    w.set("llama.block_count", U32, 1 << 24)
    [result] = load_in_child([w.write(tmp_path / "layers.gguf")])
    assert result["kind"] == "error", result
    assert "blk.1." in result["message"] or "block_count" in result["message"], result


def test_a_head_count_whose_width_wraps_an_int_is_refused(tmp_path):
    # 2^28 + 2 heads of 16 dimensions: 2^32 + 32, which as an int wraps to the tensors' 32
    w = small()
    w.set("llama.attention.head_count", U32, (1 << 28) + 2)
    w.set("llama.attention.key_length", U32, 16)
    [result] = load_in_child([w.write(tmp_path / "heads.gguf")], probe=True)
    assert result["kind"] == "error" and "head_count" in result["message"], result


def test_a_feed_forward_length_no_tensor_has_sizes_nothing(tmp_path):
    # gpt-oss routes every block to experts: its dense width is checked against no tensor
    w = build_tiny_gpt_oss(n_ctx=64)
    w.set("gpt-oss.feed_forward_length", U32, 1 << 30)
    [result] = load_in_child([w.write(tmp_path / "ff.gguf")], probe=True)  # within 1 GiB
    assert result["kind"] == "ok" and "probe_error" not in result, result


def test_expert_widths_no_tensor_has_size_nothing(tmp_path):
    # every block dense (leading_dense_block_count): the expert widths meet no tensor
    a = "ernie4_5-moe"
    w = build_tiny_llama(n_layer=2)
    for kv in w.kvs:
        kv.key = kv.key.replace("llama.", f"{a}.", 1) if kv.key.startswith("llama.") else kv.key
    w.set("general.architecture", STRING, a)
    for key, value in [("leading_dense_block_count", 2), ("interleave_moe_layer_step", 1), ("expert_count", 4),
                       ("expert_used_count", 2), ("expert_feed_forward_length", 1 << 30)]:
        w.set(f"{a}.{key}", U32, value)
    [result] = load_in_child([w.write(tmp_path / "experts.gguf")], probe=True)  # within 1 GiB
    assert result["kind"] == "ok" and "probe_error" not in result, result


def test_a_matrix_input_wider_than_the_others_has_room_to_be_quantized(tmp_path):
    # Gated DeltaNet's output projection reads its 256 value heads of 64 (16,384 wide),
    # where every other matrix reads 64 or 32: its Q8_0 activations overran the buffer
    # sized by the model's widths (a crash at the first prefill)
    w = build_tiny_qwen35(n_embd=64, n_head=1, n_head_kv=1, head_dim=32, rope_dim=16, sections=(3, 3, 2, 0),
                          n_ff=32, k_heads=1, v_heads=256, state=64, weight_type=GGML_Q8_0)
    [result] = load_in_child([w.write(tmp_path / "wide.gguf")], probe=True)
    assert result["kind"] == "ok" and "probe_error" not in result, result


def test_a_matrix_wider_than_any_model_is_refused(tmp_path):
    w = build_tiny_llama(n_embd=8, n_head=2, n_head_kv=1, n_ff=1 << 19, n_layer=1, n_vocab=280)
    [result] = load_in_child([w.write(tmp_path / "ffn.gguf")])
    assert result["kind"] == "error" and "ffn_down.weight is 524288 wide" in result["message"], result


_MANY_HEADS = textwrap.dedent("""
    import sys
    from llmd.engine.native import Engine
    engine = Engine(sys.argv[1], n_threads=2, max_sessions=1)
    session = engine.new_session()
    session.prefill([5] * 256)  # 256 tokens x 256 heads = 65536 attention tasks
    print("done", len(session.logits()))
""")


def test_prefill_with_256_heads_finishes(tmp_path):
    w = build_tiny_llama(n_vocab=259, n_embd=512, n_head=256, n_head_kv=1, n_ff=32, n_layer=1,
                         n_ctx=256, seed=5)
    path = w.write(tmp_path / "heads.gguf")
    try:
        proc = subprocess.run([sys.executable, "-c", _MANY_HEADS, str(path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        pytest.fail("prefill of 256 tokens with 256 heads did not finish in 5 s")
    assert proc.stdout.split() == ["done", "259"], proc.stderr[-2000:]
