"""The files llama.cpp's own writer makes (test-llama-archs -o) load in llmd and compute
llama.cpp's perplexity: tests/llama_archs.py rebuilds each from its layout
(tests/data/llama_archs.json.gz: the writer's metadata forms, tensor names, shapes and
types) with a real vocabulary from llama.cpp's models/ggml-vocab-*.gguf (reference data)
and weights drawn from a seed, and GOLDEN holds llama-perplexity -c 128 -b 128 over its
TEXT on exactly that file, as `python -m tests.llama_archs LLAMA_DIR` printed it with the
llama.cpp of the llama-cpp-python 0.3.36 sdist. No llama.cpp runs here."""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.llama_archs import MODELS, N_CTX, TEXT, load_layout, writer_model
from tests.support.llama_cpp_golden import perplexity_of, scored_chunks

# name -> llama.cpp's perplexity over TEXT on the regenerated file
GOLDEN = {
    "gemma3-dense": 151792.6013,
    "llama-dense": 144367.5822,
    "llama-moe": 142033.1355,
    "qwen3-dense": 572531.2425,
    "qwen35-dense": 615850.0561,
    "qwen35moe-moe": 615111.786,
    "qwen2-dense": 596541.9128,
    "qwen2moe-moe": 587626.2475,
    "qwen3moe-moe": 587450.6127,
    "phi3-dense": 146333.9711,
    "smollm3-dense": 624810.6979,
    "lfm2-dense": 778770.5081,
    "lfm2moe-moe": 779543.3582,
    "olmo2-dense": 635006.0176,
    "exaone4-dense": 644606.3929,
    "ernie4_5-moe": 146237.3637,
    "ernie4_5-moe-moe": 146268.3902,
    "smallthinker-moe": 586610.6976,
    "mistral3-dense": 144367.5822,
    "mistral3-moe": 142033.1355,
    "gpt-oss-moe": 616325.8532,
}
# F32 weights (the writer's), F16 embeddings: both engines sum the same products in
# different orders. Measured within 0.01 % of llama.cpp on every model here (and as close
# on test-llama-archs' own weights, which the script also compares); issue 29's bar is 0.5 %.
TOLERANCE = 0.001
# Each token of the first chunk: llmd's log-probability of the next token within
# TOKEN_TOLERANCE of llama.cpp's (as its --kl-divergence-base file gives them, within
# 1.8e-4), and the same most likely token where llama.cpp's two best are further apart
# than twice that. Measured: within 0.0015 on every model here, with the avx512 and avx2
# kernels alike (0.0003 on average): llama.cpp rounds the activations to F16 before an F16
# matrix (the output's) and keeps K and V as F16.
TOKEN_TOLERANCE = 0.003
# What this can and cannot see (engine mutations, measured): a .scale not applied fails 19
# of the 20 (not gemma3, whose norms cancel it); olmo2's window doubled fails (+0.6 %);
# expert 0's scale used for every expert fails qwen3moe and qwen35moe only. On these
# two-layer random models perplexity averages away per-token changes, so a swapped RoPE
# layout (qwen2, smollm3, exaone4), an attention scale 1.25x or gemma3's window doubled
# stay within 0.03 %: those need their own tests.


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_archs")

    def file(name: str):
        path = directory / f"{name}.gguf"
        if not path.exists():
            writer_model(name).write(path)
        return path
    return file


@pytest.fixture(scope="module")
def scores(files):
    """name -> llmd's scored_chunks of its file with each position's most likely token,
    computed once for both the perplexity and the per-token checks."""
    cache = {}

    def score(name: str):
        if name not in cache:
            cache[name] = scored_chunks(files(name), TEXT, N_CTX, n_top=1)
        return cache[name]
    return score


@pytest.mark.parametrize("name", list(GOLDEN))
def test_llama_cpp_s_own_file_computes_llama_cpp_s_perplexity(scores, name):
    assert perplexity_of(scores(name)) == pytest.approx(GOLDEN[name], rel=TOLERANCE)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_each_token_of_the_first_chunk_gets_llama_cpp_s_log_probability_and_top_token(scores, name):
    golden = load_layout(name)["first_chunk"]
    ours = scores(name)[0]
    assert len(ours) == len(golden["log_probs"])
    for position, ((log_prob, top), theirs, best, margin) in enumerate(
            zip(ours, golden["log_probs"], golden["top_ids"], golden["margins"])):
        assert log_prob == pytest.approx(theirs, abs=TOKEN_TOLERANCE), f"position {position}"
        if margin > 2 * TOKEN_TOLERANCE:  # else each side's error may swap the two
            assert top[0][0] == best, f"position {position}"


def test_the_writer_s_files_hold_what_llmd_must_read_leniently():
    """What makes these files worth loading: per-layer flags as uint32 arrays, per-tensor
    scales and input scales, optional biases, a reranker's head, fused expert gate/up."""
    def metadata(name):
        return {key: vtype for key, vtype, _ in load_layout(name)["metadata"]}

    def tensors(name):
        return {t[0] for t in load_layout(name)["tensors"]}
    assert metadata("gemma3-dense")["gemma3.attention.sliding_window_pattern"] == 9  # an array
    assert metadata("qwen35-dense")["qwen35.attention.recurrent_layers"] == 9
    assert {"blk.0.attn_q.scale", "blk.0.attn_q.input_scale", "blk.0.attn_q.bias"} <= tensors("gemma3-dense")
    assert "cls.output.weight" in tensors("qwen3-dense")
    assert "blk.0.ffn_gate_up_exps.weight" in tensors("qwen35moe-moe")


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_of_the_writer_loads_naming_what_it_leaves_unused(files, name):
    with Engine(str(files(name)), n_threads=2, n_ctx=N_CTX, max_sessions=1) as e:
        assert e.info.architecture == MODELS[name][0]
        assert any(w.startswith("tensor blk.0.") and ".input_scale and " in w for w in e.info.warnings)
        assert any("cls.output.weight" in w for w in e.info.warnings) == (name == "qwen3-dense")
