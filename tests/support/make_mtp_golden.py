"""Prints golden multi-token-prediction drafts from llama.cpp (run by hand, never by the tests).

    python -m tests.support.make_mtp_golden LLAMA_DIR [--split] [NAME ...]

LLAMA_DIR is a llama.cpp source tree built in LLAMA_DIR/build (libllama). For every NAME
(default: all of tests.engine.test_draft_nextn.MODELS) it writes that module's
nextn_model(NAME) and runs a small program against
libllama that this script compiles, which drives the model's MTP block as llama.cpp's
speculative decoding does (common/speculative.cpp: draft-mtp, and the server's rounds):

  - a target context gives, for every token of a batch (nextn embeddings on, unmasked),
    h = the last layer's output after output_norm, the row the LM head reads;
  - an MTP context on the same model keeps the MTP block's own KV cache: it takes the
    token at position p with h of position p - 1 from the target (zeros at p = 0);
  - the prompt (test_arch.TEXT's first PROMPT_TOKENS tokens) goes through the target in
    one batch (with --split: two, cut in the middle; the drafts must not change), and
    then through the MTP context;
  - ROUNDS rounds of greedy speculative decoding: t is the target's greedy token at
    position P. The MTP takes (t at P, h of P - 1); the argmax of its logits is draft 1,
    and its own h (after its shared head norm) with draft 1 at P + 1 gives draft 2, and
    so on to DRAFTS drafts. The drafted positions leave the MTP cache, the target
    decodes [t, d1..dK] at P..P+K with logits on every row and accepts the longest run of
    drafts equal to its greedy tokens (n of them), and the MTP context takes that same
    batch, each token with the target's h of the row before (the first with h of P - 1).
    Both caches are cut back to P + n (the target's DeltaNet state by llama.cpp's
    rollback snapshots, n_rs_seq = DRAFTS), the next t is the target's greedy token from
    row n and the pending h that row's h.

It prints, per model, one (t, drafts, margins, accepted) tuple per round, margins being
the MTP logits' top-1 minus top-2 gap for each draft.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from llmd.engine.native import Engine
from tests.engine.test_arch import N_CTX, PROMPT_TOKENS, TEXT
from tests.engine.test_draft_nextn import MODELS, nextn_model

DRAFTS = 3
ROUNDS = 4

MTP_SOURCE = r"""
#include "llama.h"
#include "llama-ext.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
// mtp MODEL DRAFTS ROUNDS ID... : prints "t d1 m1 .. dK mK | accepted" per round
// N_CTX: context and batch size; SPLIT (optional): prompt tokens in the first target batch

static int n_vocab, n_embd;

static int top(const float *logits, float *gap) {
    int a = 0, b = 1;
    if (logits[b] > logits[a]) a = 1, b = 0;
    for (int i = 2; i < n_vocab; ++i) {
        if (logits[i] > logits[a]) b = a, a = i;
        else if (logits[i] > logits[b]) b = i;
    }
    if (gap) *gap = logits[a] - logits[b];
    return a;
}

// one entry of a batch; with h, the MTP's hidden input for it, passed as the token's
// embedding as common_batch::set_embd does (llama_batch_ext_set_embd_state is a stub)
static void add(llama_batch_ext *batch, llama_token id, llama_pos pos, bool output, const float *h) {
    int idx = llama_batch_ext_add_token(batch, 0, id);
    if (idx < 0) exit(10);
    llama_batch_ext_set_pos(batch, idx, &pos);
    if (h && !llama_batch_ext_set_embd_token(batch, idx, {h, 1, (size_t) n_embd})) exit(11);
    if (output) llama_batch_ext_set_output_logits(batch, idx, true);
}

// the MTP context takes the tokens the target just decoded (from position pos), each with
// the target's h of the row before, the first with `pending`; pending becomes row `keep`
static void mtp_follow(llama_context *tgt, llama_context *mtp, llama_batch_ext *batch,
                       const std::vector<llama_token> &ids, llama_pos pos, std::vector<float> &pending, int keep) {
    llama_batch_ext_clear(batch);
    for (size_t k = 0; k < ids.size(); ++k)
        add(batch, ids[k], pos + k, false, k == 0 ? pending.data() : llama_get_embeddings_nextn_ith(tgt, k - 1));
    if (llama_process(mtp, LLAMA_PROCESS_TYPE_DECODE, batch)) exit(12);
    const float *h = llama_get_embeddings_nextn_ith(tgt, keep);
    pending.assign(h, h + n_embd);
}

int main(int argc, char **argv) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = true;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const int drafts = atoi(argv[2]), rounds = atoi(argv[3]);
    std::vector<llama_token> prompt;
    for (int i = 4; i < argc; ++i) prompt.push_back(atoi(argv[i]));
    const int n_prompt = prompt.size();
    const int split = getenv("SPLIT") ? atoi(getenv("SPLIT")) : 0;
    n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    n_embd = llama_model_n_embd_out(model);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = atoi(getenv("N_CTX"));
    cp.n_threads = cp.n_threads_batch = 2;
    cp.n_rs_seq = drafts;  // the DeltaNet state can go back up to `drafts` positions
    llama_context *tgt = llama_init_from_model(model, cp);
    if (!tgt) return 2;
    llama_set_embeddings_nextn(tgt, true, false);
    cp.n_rs_seq = 0;
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cp.ctx_other = tgt;
    llama_context *mtp = llama_init_from_model(model, cp);
    if (!mtp) return 3;
    llama_set_embeddings_nextn(mtp, true, true);
    llama_batch_ext *bt = llama_batch_ext_init(tgt), *bm = llama_batch_ext_init(mtp);

    // the prompt: target first, then the MTP on the same tokens
    std::vector<float> pending(n_embd, 0.0f);
    for (int a = 0; a < n_prompt;) {
        const int b = a < split && split < n_prompt ? split : n_prompt;
        llama_batch_ext_clear(bt);
        for (int p = a; p < b; ++p) add(bt, prompt[p], p, p == b - 1, nullptr);
        if (llama_process(tgt, LLAMA_PROCESS_TYPE_DECODE, bt)) return 4;
        const std::vector<llama_token> chunk(prompt.begin() + a, prompt.begin() + b);
        mtp_follow(tgt, mtp, bm, chunk, a, pending, b - a - 1);
        a = b;
    }

    llama_pos P = n_prompt;
    llama_token t = top(llama_get_logits_ith(tgt, -1), nullptr);
    for (int r = 0; r < rounds; ++r) {
        // draft: chain the MTP from (t at P, h of P - 1)
        std::vector<llama_token> verify = {t};  // t and its drafts
        std::vector<float> h = pending, gaps(drafts);
        for (int i = 0; i < drafts; ++i) {
            llama_batch_ext_clear(bm);
            add(bm, verify.back(), P + i, true, h.data());
            if (llama_process(mtp, LLAMA_PROCESS_TYPE_DECODE, bm)) return 5;
            verify.push_back(top(llama_get_logits_ith(mtp, 0), &gaps[i]));
            const float *hn = llama_get_embeddings_nextn_ith(mtp, 0);
            h.assign(hn, hn + n_embd);
        }
        // the drafted positions leave the MTP cache (an M-RoPE batch must start past the
        // cache's last position): it takes the verified batch there
        if (!llama_memory_seq_rm(llama_get_memory(mtp), 0, P, -1)) return 6;

        // verify: the target decodes [t, d1..dK] and keeps the drafts it would have chosen
        llama_batch_ext_clear(bt);
        for (int i = 0; i <= drafts; ++i) add(bt, verify[i], P + i, true, nullptr);
        if (llama_process(tgt, LLAMA_PROCESS_TYPE_DECODE, bt)) return 7;
        int n = 0;
        while (n < drafts && top(llama_get_logits_ith(tgt, n), nullptr) == verify[n + 1]) ++n;
        const llama_token next = top(llama_get_logits_ith(tgt, n), nullptr);
        mtp_follow(tgt, mtp, bm, verify, P, pending, n);
        if (!llama_memory_seq_rm(llama_get_memory(tgt), 0, P + n + 1, -1)) return 8;
        if (!llama_memory_seq_rm(llama_get_memory(mtp), 0, P + n + 1, -1)) return 9;

        printf("%d", t);
        for (int i = 0; i < drafts; ++i) printf(" %d %.4f", verify[i + 1], gaps[i]);
        printf(" | %d\n", n);
        t = next;
        P += n + 1;
    }
    llama_batch_ext_free(bt);
    llama_batch_ext_free(bm);
    llama_free(mtp);
    llama_free(tgt);
    llama_model_free(model);
    return 0;
}
"""


def main(llama: Path, names: list[str], split: bool) -> None:
    work = Path(tempfile.mkdtemp())
    program = work / "mtp"
    (work / "mtp.cpp").write_text(MTP_SOURCE)
    lib = llama / "build/bin"
    subprocess.run(["g++", "-O2", "-std=c++17", str(work / "mtp.cpp"), f"-I{llama}/include", f"-I{llama}/src",
                    f"-I{llama}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lib}", "-o", str(program)], check=True)
    for name in names or MODELS:
        model = nextn_model(name).write(work / f"{name}.gguf")
        with Engine(str(model), max_sessions=2) as engine:
            prompt = engine.tokenize(TEXT)[:PROMPT_TOKENS]
        env = {"N_CTX": str(N_CTX), "SPLIT": str(len(prompt) // 2 if split else 0)}
        out = subprocess.run([str(program), str(model), str(DRAFTS), str(ROUNDS), *map(str, prompt)],
                             capture_output=True, text=True, check=True, env=env).stdout
        rounds = []
        for line in out.splitlines():
            fields, accepted = line.split("|")
            t, *pairs = fields.split()
            rounds.append((int(t), [int(d) for d in pairs[0::2]], [round(float(m), 3) for m in pairs[1::2]],
                           int(accepted)))
        print(f'    "{name}": {rounds},', flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("llama", type=Path)
    parser.add_argument("--split", action="store_true", help="the prompt in two target batches")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    main(args.llama, args.names, args.split)
