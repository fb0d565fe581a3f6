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
    "gemma2-dense": 555919160229413.7,
    "gemma3-dense": 58958.9551,
    "llama-dense": 59209.7585,
    "llama-moe": 75179.471,
    "qwen3-dense": 347873.4408,
    "qwen35-dense": 332259.3949,
    "qwen35moe-moe": 327770.9625,
    "qwen2-dense": 328274.2038,
    "qwen2moe-moe": 309902.2304,
    "qwen3moe-moe": 307956.0712,
    "phi3-dense": 57610.8416,
    "smollm3-dense": 224033.2059,
    "lfm2-dense": 214877.216,
    "lfm2moe-moe": 212093.0479,
    "olmo2-dense": 209027.2943,
    "exaone4-dense": 259511.8818,
    "ernie4_5-moe": 59890.7906,
    "ernie4_5-moe-moe": 66497.3303,
    "smallthinker-moe": 338145.5121,
    "mistral3-dense": 59209.7585,
    "mistral3-moe": 75179.471,
    "gpt-oss-moe": 243329.5792,
    "granite-dense": 254384.6514,
    "granitemoe-moe": 218401.1944,
    "granitehybrid-dense": 246570.1813,
    "glm4-dense": 210087.0882,
    "glm4moe-moe": 240099.3758,
    "nemotron_h-dense": 265667.0843,
    "nemotron_h_moe-dense": 265667.0843,
}
# F32 weights (the writer's), F16 embeddings: both engines sum the same products in
# different orders. Measured within 0.02 % of llama.cpp on every model here; issue 29's
# bar is 0.5 %.
TOLERANCE = 0.001
# Each token of the first chunk: llmd's log-probability of the next token within
# TOKEN_TOLERANCE of llama.cpp's (as its --kl-divergence-base file gives them, within
# 1.8e-4), and the same most likely token where llama.cpp's two best are further apart
# than twice that. Measured within 0.0035 on every model here but granite-dense (0.0077;
# 0.0001 on the writer's own weights), most within 0.001: llama.cpp rounds activations to
# F16 before an F16 matrix (the output's) and keeps K and V as F16. The engine mistakes
# tried (below) move some token by 0.04 or more. Where llama.cpp's file holds only that a
# token is below its range (more than 16 below the best: gemma2's regenerated model, whose
# capped logits lie up to 60 apart, at 51 of 63 positions), llmd's must be at most that.
TOKEN_TOLERANCE = 0.01
# What the checks see (engine mutations, measured on the files but mistral3's, which are
# llama's): RoPE layout swapped, RoPE base doubled or attention scale 1.25x fail both
# checks on every model. Caught per token but not (always) by the perplexity: attn_q's
# .scale not applied (13 of 15, perplexity 9; not lfm2moe), q and k norms swapped (all
# 8 measured, perplexity 5), the sliding window one position wider (gemma3, lfm2,
# olmo2; perplexity not gemma3), Qwen3.5's dt bias dropped (perplexity neither). A norm
# epsilon 100x is seen only through Qwen3.5's L2 norms (activations of RMS about 1).


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
    below = set(golden.get("below", ()))
    for position, ((log_prob, top), theirs, best, margin) in enumerate(
            zip(ours, golden["log_probs"], golden["top_ids"], golden["margins"])):
        if position in below:  # llama.cpp's file says only that it is at most its lowest
            assert log_prob <= theirs + TOKEN_TOLERANCE, f"position {position}"
        else:
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
        assert e.info.n_labels == (name == "qwen3-dense")  # its reranker's head: one label
