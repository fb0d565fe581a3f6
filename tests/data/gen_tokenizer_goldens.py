"""Writes tests/data/tokenizer_goldens.json: what llama.cpp makes of the hard cases.

Not run by the tests (they read the JSON). Run it by hand with the reference build:
    LLAMA=/path/to/llama.cpp python3 -m tests.data.gen_tokenizer_goldens
It needs $LLAMA/build/bin/test-tokenizer-0, llama-tokenize and libllama, g++, and
the vocab files that `python -m tests.reference_data` fetched. For each vocabulary
it records the ids of every case as test-tokenizer-0 computes them (no BOS,
control tokens as text), the ids of the control-token case with parse_special
(llama-tokenize has no switch for it, so a few lines against llama.h, compiled
here, call llama_tokenize), and BOS, EOS, add_bos and the end-of-generation ids
from llama-tokenize's log. Pre-tokenizers
without a vocab file of their own run on a vocabulary built by
tests.support.gguf_writer.build_split_vocab, whose ids show where the words were cut;
SentencePiece in Gemma's shape (no space prefix) runs on build_spm_vocab.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from tests.support.gguf_writer import build_spm_vocab, build_split_vocab
from tests.reference_data import reference_dir

LLAMA = Path(os.environ.get("LLAMA", "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp"))
OUT = Path(__file__).with_name("tokenizer_goldens.json")

CASES = {
    "digits": "1234567890 3.14159 1,000,000 -42 007 x2y33z444",
    "non_ascii_digits": "٣٤٥ ௫௬ ①②③ ⅷ ¾ ２０２４",
    "cjk": "我想在apple工作1314151天～ 日本語のテキストです。한국어 텍스트",
    "emoji": "🦙🚀 😶‍🌫️ family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ✅",
    "long_spaces": " " * 300 + "x" + " " * 33,
    "whitespace_mix": "\n\n\n\t\t  \r\n  end\u00a0\u3000 nbsp\u2003em\u000b\u000cff",
    "newline_runs": "a\n\n\n\nb\r\n\r\nc" + "\n" * 40,
    "case_runs": "HELLO World heLLo McDonald's ÉCOLE école İstanbul ΣΊΣΥΦΟΣ camelCaseWord XMLHttpRequest",
    "contractions": "I'LL don't we'Re they've 's 'd she'S",
    "marks": "e\u0301 n\u0303 ñ Tiếng Việt नमस्ते ﷺ",
    "code": "def f(x):\n    return x**2  # comment\n\tif (a<=b && c!=d) { y = [1,2,3]; }",
    "control_text": "<|im_end|><|endoftext|><s></s><|eot_id|><start_of_turn>user <|begin_of_text|>[INST] <bos>",
    "symbols": "$100 + 50% = ¥€£ ©®™ →←↑ ∑∫√ «quote» ‹›",
}

# Reference vocabularies with vectors, by the name in models/ggml-vocab-NAME.gguf.
VOCABS = ["command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
          "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
# Vocab files without vectors: only their special ids are recorded.
SPECIALS_ONLY = ["aquila", "baichuan", "gpt-neox"]
# Pre-tokenizers with no vocab file here, run on a split-revealing vocabulary.
SPLIT_PRES = ["tekken", "gpt-4o", "deepseek-v3", "llama3", "qwen2", "qwen35", "default", "bloom", "chameleon",
              "jais-2", "seed-coder", "bailingmoe", "exaone-moe", "minicpm5", "viking", "laguna"]


def tokenizer0(vocab: Path) -> dict[str, list[int]]:
    """Ids of every case as test-tokenizer-0 computes them (add_special and parse_special off)."""
    texts = list(CASES.values())
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / "vocab.gguf"
        link.symlink_to(vocab.resolve())
        Path(str(link) + ".inp").write_bytes("\n__ggml_vocab_test__\n".join(texts).encode())
        Path(str(link) + ".out").write_text("\n".join("0" for _ in texts) + "\n")
        run = subprocess.run([str(LLAMA / "build/bin/test-tokenizer-0"), str(link)], capture_output=True)
    # It prints its cases in std::map order: byte order of the texts.
    found = [list(map(int, m.split())) for m in re.findall(rb"\ntok: ([0-9 ]*)\n", run.stdout)]
    ordered = sorted(texts, key=lambda t: t.encode())
    assert len(found) == len(ordered), run.stderr.decode()[-2000:]
    by_text = dict(zip(ordered, found))
    return {name: by_text[text] for name, text in CASES.items()}


def llama_tokenize(vocab: Path, text: str, *flags: str) -> tuple[list[int], str]:
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(text.encode())
        f.flush()
        run = subprocess.run([str(LLAMA / "build/bin/llama-tokenize"), "-m", str(vocab), "-f", f.name, "--ids",
                              "--no-escape", "-v", *flags], capture_output=True, check=True)
    ids = json.loads(run.stdout.decode().strip().splitlines()[-1])
    return ids, run.stderr.decode()


def specials(vocab: Path) -> dict:
    with_bos, log = llama_tokenize(vocab, "a")
    without, _ = llama_tokenize(vocab, "a", "--no-bos")

    def ids(kind: str) -> list[int]:
        return [int(x) for x in re.findall(rf"print_info: {kind} token\s+= (\d+)", log)]

    bos, eos = ids("BOS"), ids("EOS")
    return {"bos": bos[0] if bos else -1, "eos": eos[0] if eos else -1,
            "add_bos": len(with_bos) > len(without), "eog": ids("EOG")}


PARSE_SPECIAL_SOURCE = r"""
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>
int main(int argc, char **argv) {
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss; ss << in.rdbuf();
    std::string text = ss.str();
    const llama_vocab *v = llama_model_get_vocab(m);
    std::vector<llama_token> ids(text.size() * 4 + 8);
    int n = llama_tokenize(v, text.data(), (int)text.size(), ids.data(), (int)ids.size(), false, true);
    printf("[");
    for (int i = 0; i < n; ++i) printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
    llama_model_free(m);
}
"""


def parse_special_tool(tmp: Path) -> Path:
    (tmp / "tok.cpp").write_text(PARSE_SPECIAL_SOURCE)
    subprocess.run(["g++", "-O1", "-std=c++17", str(tmp / "tok.cpp"), f"-I{LLAMA}/include",
                    f"-I{LLAMA}/ggml/include", f"-L{LLAMA}/build/bin", "-lllama",
                    f"-Wl,-rpath,{LLAMA}/build/bin", "-o", str(tmp / "tok")], check=True)
    return tmp / "tok"


def record(vocab: Path, tool: Path) -> dict:
    entry = specials(vocab)
    entry["ids"] = tokenizer0(vocab)
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(CASES["control_text"].encode())
        f.flush()
        run = subprocess.run([str(tool), str(vocab), f.name], capture_output=True, check=True)
    entry["ids_parse_special"] = json.loads(run.stdout)
    return entry


def main() -> None:
    models = reference_dir() / "models"
    out = {"reference": "llama.cpp of llama-cpp-python 0.3.36: test-tokenizer-0 for ids, llama-tokenize "
                        "--parse-special for control_text, llama-tokenize -v for the special ids",
           "cases": CASES, "vocabs": {}, "split_vocabs": {}, "spm_vocabs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tool = parse_special_tool(Path(tmp))
        for name in VOCABS:
            out["vocabs"][name] = record(models / f"ggml-vocab-{name}.gguf", tool)
        for name in SPECIALS_ONLY:
            out["vocabs"][name] = specials(models / f"ggml-vocab-{name}.gguf")
        for pre in SPLIT_PRES:
            path = build_split_vocab(list(CASES.values()), pre).write(Path(tmp) / f"split-{pre}.gguf")
            out["split_vocabs"][pre] = {"ids": tokenizer0(path)}
        for prefix in (False, True):
            path = build_spm_vocab(list(CASES.values()), add_space_prefix=prefix).write(Path(tmp) / "spm.gguf")
            out["spm_vocabs"][f"add_space_prefix={prefix}"] = record(path, tool)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
