"""llmd.commands.accuracy: the perplexity (and KL divergence) the quantized kernels cost, per
weight type and per kernel variant this CPU runs, on a small random-weight model.

Each mix of `llmd quantize` is made from one F32 model, and each type it cannot write
(Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4) or that takes the activations unrounded (F16, BF16)
as a model of random blocks of that type; then each file's F32 twin (the same weights
decoded), and both score the same text in a process per variant.
The difference is the kernels' alone (the activations' int8 rounding, the
accumulation order), and stays within BOUND of the exact result (0.5 %, the
ceiling llmd sets itself on real models: llmd.commands.accuracy.MAX_COST).
"""
from __future__ import annotations

import math
import os

import pytest

from llmd.commands import accuracy
from llmd.commands.perplexity import text_logprobs
from llmd.engine.native import Engine
from llmd.commands.quantize import quantize_file
from tests.support.gguf_writer import (
    GGML_BF16, GGML_F16, GGML_F32, GGML_IQ4_NL, GGML_IQ4_XS, GGML_MXFP4, GGML_Q2_K, GGML_Q3_K, build_tiny_llama,
    encode_f32,
)

# The mixes whose main matrix type the engine's quantizer writes: every 32-element
# type, and the K-quants with their own output types.
MIXES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q5_K_S", "Q6_K")
# Every other type the engine runs, as files of random blocks (or values) of it alone.
WRITTEN = {"Q2_K": GGML_Q2_K, "Q3_K": GGML_Q3_K, "IQ4_NL": GGML_IQ4_NL, "IQ4_XS": GGML_IQ4_XS,
           "MXFP4": GGML_MXFP4, "F16": GGML_F16, "BF16": GGML_BF16}
TYPES = MIXES + tuple(WRITTEN)
# The float types' kernels take the activations as they are: only the order of the
# float sums can differ from the twin's.
FLOATS = ("F16", "BF16")
FLOAT_KLD_BOUND = 1e-6
# |cost| on this model, either sign: the int8 rounding of the activations is noise
# that can help a short text as well as hurt it. Measured on an AVX2 machine (scalar
# and avx2): at most 0.27 % (Q6_K), most types under 0.15 %; on a Zen 4 (scalar, avx2,
# avx512) the random IQ4_XS file, whose blocks spread wider than the others' and whose
# mean KL divergence is 5x theirs (0.0027), costs +0.45 to +0.50 %, at the bound, every
# other type at most 0.28 %. The random Q2_K file hardly reacts to its activations'
# rounding (mean KLD 2e-6: its blocks' mins leave its weights a large common offset).
BOUND = accuracy.MAX_COST
KLD_BOUND = 0.01
TEXT = ("The river ran past the old mill, and the miller counted the sacks of grain that the farmers "
        "brought him in the autumn. Some years the harvest was good and the mill turned from dawn "
        "until dark; in others the wheel stood still for weeks, and the miller mended nets. ") * 3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("accuracy")
    def model(weight_type: int) -> str:
        # Rows of 256: every matrix is whole K-quant super-blocks, so each mix uses its own
        # types. The output norm at 1/4 gives logits of a real model's spread (the writer's
        # own make them so peaked that the text's tokens get ~1e-7 probability).
        w = build_tiny_llama(n_vocab=512, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_ctx=256,
                             weight_type=weight_type)
        w.remove_tensor("output_norm.weight")
        w.add_tensor("output_norm.weight", [256], GGML_F32, encode_f32([0.25] * 256))
        return str(w.write(folder / f"base-{weight_type}.gguf"))

    base = model(GGML_F32)
    text = folder / "text.txt"
    text.write_text(TEXT)
    made = {}
    with open(os.devnull, "w") as quiet:
        for name in TYPES:
            twin = str(folder / f"m-{name}-F32.gguf")
            if name in WRITTEN:
                quantized = model(WRITTEN[name])
            else:
                quantized = str(folder / f"m-{name}.gguf")
                quantize_file(base, quantized, name, n_threads=1, out=quiet)
            accuracy.write_twin(quantized, twin, threads=1)
            made[name] = (quantized, twin)
    return made, str(text)


@pytest.mark.parametrize("variant", accuracy.variants())
def test_quantized_kernels_cost_little_perplexity_over_the_exact_result(files, variant):
    made, text = files
    pairs = [(made[name][1], made[name][0]) for name in TYPES]
    found = accuracy.measure(pairs, text, variant, threads=1, ctx=128)
    costs = {name: accuracy.compare(variant, scored) for name, scored in zip(TYPES, found)}
    assert all(abs(c.cost) <= BOUND for c in costs.values()), \
        {m: f"{100 * c.cost:+.3f} % (standard error {100 * c.stderr:.3f} %)" for m, c in costs.items()}
    # The rounding always costs some divergence, and little: under KLD_BOUND nats a token;
    # without it (the float types) next to none.
    rounded = {m: c.kld for m, c in costs.items() if m not in FLOATS}
    assert all(0 < kld <= KLD_BOUND for kld in rounded.values()), rounded
    assert all(costs[m].kld <= FLOAT_KLD_BOUND for m in FLOATS), {m: costs[m].kld for m in FLOATS}


def test_a_file_against_itself_costs_nothing_and_scores_as_perplexity_does(files):
    """The one-position-at-a-time scoring gives the batched perplexity's log-probabilities
    (the engine is batch-invariant; only the log-softmax, in double here and in float in
    the engine, differs in the last bits), and identical distributions diverge by 0."""
    made, text_file = files
    twin, text = made["Q4_0"][1], open(text_file).read()
    with Engine(twin, n_threads=1, n_ctx=128, max_sessions=1) as a, \
            Engine(twin, n_threads=1, n_ctx=128, max_sessions=1) as b:
        scored = accuracy.pair_scores(a, b, text, 128)
        batched, _ = text_logprobs(a, text, 128)
    assert scored["exact"] == scored["quantized"] == pytest.approx(batched, abs=1e-5)
    assert scored["kld"] == [0.0] * len(batched)


def test_the_cost_is_the_perplexity_ratio_and_its_error_that_of_the_paired_mean():
    c = accuracy.compare("scalar", {"exact": [-1.0, -2.0, -3.0, -2.0], "quantized": [-1.1, -2.1, -2.9, -2.3],
                                    "kld": [0.01, 0.03, 0.01, 0.03]})
    # differences 0.1, 0.1, -0.1, 0.3: mean 0.1, population sd sqrt(0.02), over sqrt(4)
    assert c.exact == pytest.approx(math.exp(2.0)) and c.quantized == pytest.approx(math.exp(2.1))
    assert c.cost == pytest.approx(math.exp(0.1) - 1) and c.stderr == pytest.approx(math.sqrt(0.02) / 2)
    assert c.kld == pytest.approx(0.02) and c.kld_stderr == pytest.approx(0.01 / 2)
    assert c.tokens == 4

def test_costs_write_a_temporary_twin_and_measure_every_variant(files, tmp_path):
    made, text = files
    quantized = tmp_path / "q.gguf"
    quantized.write_bytes(open(made["Q4_0"][0], "rb").read())
    rows = accuracy.costs(str(quantized), text, threads=1, ctx=128)
    assert [r.variant for r in rows] == accuracy.variants()
    assert all(r.exact > 1 and abs(r.cost) <= BOUND and 0 < r.kld <= KLD_BOUND for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.gguf"]  # the twin is gone


def test_bench_accuracy_needs_a_text():
    from llmd.cli import main
    assert main(["bench", "--accuracy"]) == 2
