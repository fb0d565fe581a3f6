"""The files llama.cpp's own writer makes, with a real vocabulary: llmd's perplexity on
them, and each token's log-probability, against llama.cpp's (the reference check of the
architectures, issue 29).

    python -m tests.llama_archs LLAMA_DIR [NAME ...]     (by hand, against a built llama.cpp)

NAME is one of MODELS (all by default), e.g. qwen35moe-moe: test-llama-archs' file of
that architecture and variant. For each, the script
  1. runs `LLAMA_DIR/build/bin/test-llama-archs -s SEED -a '^ARCH$' -o DIR` and reads the
     file it wrote with llmd's own GGUF reader;
  2. regenerates the model from that layout (regenerate(): the tests do the same): every
     tokenizer.* key of llama.cpp's models/ggml-vocab-VOCAB.gguf (the reference data of
     tests/reference_data.py), token_embd and output redrawn at that vocabulary's size,
     every other tensor drawn from SEED as test-llama-archs draws its own (normal, σ 0.1;
     ssm_a negative) but the norms' weights and the per-tensor `.scale`s, drawn near 1
     (see NORM_MEAN and SCALE_SPREAD);
  3. runs `llama-perplexity -c 128 -b 128 --kl-divergence-base FILE` over TEXT on it and
     prints the perplexity, which is the GOLDEN row for tests/engine/test_llama_archs.py,
     next to llmd's, and how far llmd's log-probabilities of the first chunk's tokens are
     from llama.cpp's; and the same on test-llama-archs' own weights (only the embeddings
     redrawn) for the record;
  4. keeps in tests/data/llama_archs.json.gz (under NAME) the layout: the metadata but the
     tokenizer's (each value's bytes as the file holds them) and every tensor's name,
     shape and type; and, from FILE, llama.cpp's facts on each token the first chunk
     scores (first_chunk()); a few kilobytes compressed.
Nothing it writes but that file is kept: the models are rebuilt from the layouts.
"""
from __future__ import annotations

import argparse
import array
import gzip
import heapq
import json
import math
import mmap
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from llmd.commands.quantize import read_gguf, tensor_bytes
from tests.random_model import random_f16
from tests.support.gguf_writer import GGML_F16, GGML_F32, U32, GGUFWriter, encode_tensor

LAYOUTS = Path(__file__).parent / "data" / "llama_archs.json.gz"
SEED = 29
N_CTX = 128
# name -> (test-llama-archs architecture, the vocabulary its file is given)
MODELS = {
    "gemma2-dense": ("gemma2", "llama-spm"),
    "gemma3-dense": ("gemma3", "llama-spm"),
    "llama-dense": ("llama", "llama-spm"),
    "llama-moe": ("llama", "llama-spm"),  # Mixtral's layout
    "qwen3-dense": ("qwen3", "qwen2"),
    "qwen35-dense": ("qwen35", "qwen2"),
    "qwen35moe-moe": ("qwen35moe", "qwen2"),
    "qwen2-dense": ("qwen2", "qwen2"),
    "qwen2moe-moe": ("qwen2moe", "qwen2"),
    "qwen3moe-moe": ("qwen3moe", "qwen2"),
    "phi3-dense": ("phi3", "phi-3"),
    "smollm3-dense": ("smollm3", "llama-bpe"),
    "lfm2-dense": ("lfm2", "llama-bpe"),
    "lfm2moe-moe": ("lfm2moe", "llama-bpe"),
    "olmo2-dense": ("olmo2", "llama-bpe"),
    "exaone4-dense": ("exaone4", "llama-bpe"),
    "ernie4_5-moe": ("ernie4_5", "llama-spm"),  # the writer's name; its layers are dense (ernie4_5 has no experts)
    "ernie4_5-moe-moe": ("ernie4_5-moe", "llama-spm"),
    "smallthinker-moe": ("smallthinker", "qwen2"),
    "mistral3-dense": ("mistral3", "llama-spm"),
    "mistral3-moe": ("mistral3", "llama-spm"),
    "gpt-oss-moe": ("gpt-oss", "llama-bpe"),
    "granite-dense": ("granite", "llama-bpe"),
    "granitemoe-moe": ("granitemoe", "llama-bpe"),
    "granitehybrid-dense": ("granitehybrid", "llama-bpe"),  # the writer's only granitehybrid (no experts)
    "glm4-dense": ("glm4", "llama-bpe"),
    "glm4moe-moe": ("glm4moe", "llama-bpe"),
    "nemotron_h-dense": ("nemotron_h", "llama-bpe"),
    "nemotron_h_moe-dense": ("nemotron_h_moe", "llama-bpe"),  # the writer's only nemotron_h_moe (no experts)
}
TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. "
        "The hallway smelt of boiled cabbage and old rag mats. At one end of it a coloured poster, "
        "too large for indoor display, had been tacked to the wall. It depicted simply an enormous face, "
        "more than a metre wide: the face of a man of about forty-five, with a heavy black moustache "
        "and ruggedly handsome features. Winston made for the stairs. It was no use trying the lift. "
        "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his "
        "father had taught him: one hundred and twelve, no more and no less. At the top he trimmed the wick, "
        "polished the great lens with a soft cloth, and struck a match against the iron rail. The flame caught, "
        "wavered, and then stood tall, and the beam began its slow sweep across the water. Ships he would never "
        "meet steered by it; fishermen coming home late counted its flashes to know which bay they had reached. "
        "In winter the wind shook the tower so hard that the oil trembled in its bowl, and he would sit beside it "
        "through the night with a blanket over his knees, reading by the light meant for others. He kept a log "
        "of every storm, every wreck he saw or heard of, every bird that struck the glass. The pages filled slowly. "
        "Nobody asked to read them, and he did not expect anyone to, yet he wrote each entry with care, the date "
        "first, then the weather, then whatever the sea had done that day.")
EMBEDDINGS = ("token_embd.weight", "output.weight")  # redrawn at the vocabulary's size, and output.bias
STDEV = 0.1         # test-llama-archs' default spread of every weight
# A per-tensor `.scale` (per expert: one a row) is what llama.cpp's converter writes for an
# NVFP4 checkpoint's second-level weight_scale_2, and only when it is not 1
# (_scale_is_trivial): a positive factor on a weight whose own block scales carry its
# magnitude. test-llama-archs draws it like a weight (σ 0.1, either sign), which shrinks
# every product tenfold and leaves attention too faint for perplexity to see. Drawn as
# e^N(0, SCALE_SPREAD) instead, positive and within a factor of about 2.7 of 1, the weights
# keep the writer's σ, and the scales differ enough from 1 and from each other that a scale
# not applied moves perplexity past the tests' tolerance (in every model but gemma3's,
# whose q/k norms and post-norms cancel all but the gate's scale).
SCALE_SPREAD = 0.5
# The norms' weights: test-llama-archs draws them like any weight (σ 0.1 around 0), which
# leaves every query and key a tenth of its size and the attention scores near 0, so that
# attention averages its context whatever RoPE, the attention scale or the window do
# (a swapped RoPE layout moved no log-probability by more than 0.007). Drawn around
# NORM_MEAN, as trained models have them, the scores spread over a few units.
NORM_MEAN = 1.0
# The redrawn embeddings: token_embd's rows of σ 1; output's of σ 1/√n_embd, so that the
# final hidden state (RMS about 1 after its norm) gives logits of σ about 1, which vary
# enough for perplexity to tell models apart while each next token stays within the 16
# nats below the most likely that llama-perplexity's --kl-divergence-base file resolves.
EMBEDDING_STDEV = 1.0


def _kv_value(raw: bytes, key: str) -> tuple[int, bytes]:
    """(value type, value bytes) of a key/value pair as read_gguf keeps it."""
    at = 8 + len(key.encode("utf-8"))
    return struct.unpack_from("<I", raw, at)[0], raw[at + 4:]


def read_layout(path: Path) -> tuple[dict, object, object]:
    """The layout of the GGUF at path (see the module's step 2), its header and its mapping."""
    f = open(path, "rb")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    header = read_gguf(buf, len(buf))
    kvs = []
    for key, raw in header.kvs:
        if not key.startswith("tokenizer."):
            vtype, value = _kv_value(raw, key)
            kvs.append([key, vtype, value.hex()])
    tensors = [[t.name, list(t.shape), t.type] for t in header.tensors]
    return {"metadata": kvs, "tensors": tensors}, header, buf


def vocabulary(path: Path) -> tuple[list[tuple[str, int, bytes]], int]:
    """Every tokenizer.* pair of the vocabulary file at path, and its number of tokens."""
    with open(path, "rb") as f:
        buf = f.read()
    header = read_gguf(buf, len(buf))
    pairs = [(key, *_kv_value(raw, key)) for key, raw in header.kvs if key.startswith("tokenizer.")]
    tokens = next(value for key, _, value in pairs if key == "tokenizer.ggml.tokens")
    return pairs, struct.unpack_from("<Q", tokens, 4)[0]  # an array: element type, then count


def regenerate(layout: dict, vocab: Path, seed: int = SEED, weights=None) -> GGUFWriter:
    """The model of `layout` with the vocabulary of the GGUF at `vocab`: its tokenizer keys,
    token_embd and output redrawn at its size, every other tensor drawn from seed (or,
    with `weights`, name -> bytes, taken from there)."""
    pairs, n_vocab = vocabulary(vocab)
    w = GGUFWriter()
    for key, vtype, value in layout["metadata"]:
        raw = bytes.fromhex(value)
        if key.endswith(".vocab_size"):  # the vocabulary's size, not the writer's 128 tokens
            assert vtype == U32, key
            raw = struct.pack("<I", n_vocab)
        w.append(key, vtype, None, raw=raw)
    for key, vtype, value in pairs:
        w.append(key, vtype, None, raw=value)
    for name, shape, ttype in layout["tensors"]:
        rng = random.Random(f"{seed}:{name}")
        if name in EMBEDDINGS:
            shape = [shape[0], n_vocab]
            stdev = EMBEDDING_STDEV if name == "token_embd.weight" else EMBEDDING_STDEV / math.sqrt(shape[0])
            w.add_tensor(name, shape, GGML_F16, random_f16(shape[0], n_vocab, stdev, rng))
            continue
        if name == "output.bias":
            shape = [n_vocab]
        elif weights is not None:
            w.add_tensor(name, shape, ttype, weights[name])
            continue
        assert ttype in (GGML_F32, GGML_F16), f"{name}: test-llama-archs writes F32 and F16 only"
        if name.endswith(".scale"):
            values = [math.exp(rng.gauss(0.0, SCALE_SPREAD)) for _ in range(math.prod(shape))]
        else:
            mean = NORM_MEAN if name.endswith("norm.weight") else 0.0
            values = [rng.gauss(mean, STDEV) for _ in range(math.prod(shape))]
            if "ssm_a" in name:  # a state that decays, as test-llama-archs makes it (ssm_alpha too)
                values = [-abs(v) for v in values]
        w.add_tensor(name, shape, ttype, encode_tensor(ttype, values))
    return w


def writer_model(name: str, n_ctx: int | None = None) -> GGUFWriter:
    """The model of `name` as the tests rebuild it: regenerate() with its vocabulary from
    the reference data (tests/reference_data.py), trained for n_ctx positions if given."""
    from tests.reference_data import require
    arch, vocab = MODELS[name]
    w = regenerate(load_layout(name), require(f"models/ggml-vocab-{vocab}.gguf"))
    if n_ctx is not None:
        w.set(f"{arch}.context_length", U32, n_ctx)
    return w


def load_layouts() -> dict[str, dict]:
    """name -> layout, as the script last wrote them."""
    return json.loads(gzip.decompress(LAYOUTS.read_bytes())) if LAYOUTS.exists() else {}


def load_layout(name: str) -> dict:
    return load_layouts()[name]


def first_chunk(logits_file: Path) -> dict:
    """llama.cpp's facts on each token its first chunk scores, from the file that
    `llama-perplexity --kl-divergence-base FILE` writes: "_logits_", n_ctx, n_vocab and
    n_chunk (int32), every chunk's token ids (int32), then per scored position
    (n_ctx / 2 + 1 .. n_ctx - 1 of each chunk predicted) its scale and lowest log-probability
    (two floats) and n_vocab log-probabilities as uint16 steps of that scale above the
    lowest (padded to an even count). The lowest is at most 16 below the most likely's,
    so a step is at most 16 / 65535: each log-probability within 1.3e-4 of llama.cpp's
    (within 1.8e-4 as kept, to 4 decimals).
    Returns, per position: "log_probs", the next token's log-probability, or for a token
    below the file's range (step 0: Gemma 2's capped logits reach 60 apart) the lowest,
    which bounds it from above; "top_ids", the most likely id (the lowest of a tie, as
    llmd breaks them); "margins", its log-probability less the second most likely's; and
    "below", the positions whose token is below the range."""
    data = logits_file.read_bytes()
    assert data[:8] == b"_logits_", logits_file
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<3i", data, 8)
    tokens = struct.unpack_from(f"<{n_ctx}i", data, 20)
    row_bytes = 2 * (2 * ((n_vocab + 1) // 2) + 4)
    at = 20 + 4 * n_chunk * n_ctx
    facts = {"log_probs": [], "top_ids": [], "margins": [], "below": []}
    first = n_ctx // 2
    for i in range(n_ctx - 1 - first):
        scale, lowest = struct.unpack_from("<2f", data, at + i * row_bytes)
        steps = array.array("H", data[at + i * row_bytes + 8:at + i * row_bytes + 8 + 2 * n_vocab])
        token = tokens[first + i + 1]
        if steps[token] == 0:
            facts["below"].append(i)
        best, second = heapq.nlargest(2, range(n_vocab), key=steps.__getitem__)
        facts["log_probs"].append(round(lowest + scale * steps[token], 4))
        facts["top_ids"].append(best)
        facts["margins"].append(round(scale * (steps[best] - steps[second]), 4))
    return facts


def main(llama: Path, names: list[str]) -> None:
    from tests.support.llama_cpp_golden import perplexity_of, scored_chunks
    from tests.support.make_arch_golden import perplexity
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        text = work / "text.txt"
        text.write_text(TEXT)
        for name in names or list(MODELS):
            arch, vocab = MODELS[name]
            out = work / arch
            out.mkdir(exist_ok=True)
            subprocess.run([str(llama / "build/bin/test-llama-archs"), "-s", str(SEED), "-a", f"^{arch}$",
                            "-o", str(out)], check=True, capture_output=True)
            layout, header, buf = read_layout(out / f"{name}.gguf")
            vocab_file = llama / "models" / f"ggml-vocab-{vocab}.gguf"
            own = {t.name: bytes(buf[header.data_start + t.offset:header.data_start + t.offset +
                                     tensor_bytes(t.type, t.shape)]) for t in header.tensors}
            rows = []
            for label, weights in (("regenerated", None), ("test-llama-archs weights", own)):
                model = regenerate(layout, vocab_file, weights=weights).write(work / f"{name}-{len(rows)}.gguf")
                ref = perplexity(llama, model, text, N_CTX, logits=work / "logits.bin")
                facts = first_chunk(work / "logits.bin")
                chunks = scored_chunks(model, TEXT, N_CTX, n_top=1)
                ours = perplexity_of(chunks)
                token_diff = max(abs(a - b) for i, ((a, _), b) in enumerate(zip(chunks[0], facts["log_probs"],
                                                                                strict=True))
                                 if i not in facts["below"])
                rows.append(f"{label}: llama.cpp {ref:.4f}, llmd {ours:.4f} ({(ours / ref - 1) * 100:+.3f} %), "
                            f"first chunk's log-probabilities within {token_diff:.5f}")
                model.unlink()
                if weights is None:
                    layout["first_chunk"] = facts
                    print(f'    "{name}": {ref},', flush=True)
            buf.close()
            layouts = load_layouts()
            layouts[name] = layout
            LAYOUTS.write_bytes(gzip.compress(json.dumps(layouts, sort_keys=True).encode(), mtime=0))
            print(f"    # {name}: " + "; ".join(rows), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("llama", type=Path)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        sys.exit(f"unknown model {unknown[0]} (known: {', '.join(MODELS)})")
    main(args.llama, args.names)
