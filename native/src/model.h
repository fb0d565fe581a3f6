// model.h — the Llama-family transformer: hyperparameters and weights bound to
// the GGUF mapping, the per-session KV cache, and one forward pass over a batch
// of tokens that may belong to different sessions (prefill is a batch of one
// session's tokens; batched decode is one token from each of several sessions).
#pragma once

#include "gguf.h"
#include "quants.h"
#include "threadpool.h"

#include <memory>
#include <string>
#include <vector>

namespace llmd {

// A weight matrix in GGUF layout: `rows` rows of `cols` contiguous elements.
struct Matrix {
    uint32_t type = 0;
    int64_t cols = 0; // ne[0], the input dimension
    int64_t rows = 0; // ne[1], the output dimension
    size_t row_bytes = 0;
    const uint8_t *data = nullptr;
    const void *row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

struct HParams {
    int n_vocab = 0;
    int n_ctx_train = 0;
    int n_embd = 0;    // dim
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int n_ff = 0;      // hidden dim of the FFN
    int head_dim = 0;
    int rope_dim = 0;  // leading dims of each head that RoPE rotates
    float rope_base = 10000.0f;
    float rope_scale = 1.0f; // position multiplier (linear scaling)
    float norm_eps = 1e-5f;
    int q_dim() const { return n_head * head_dim; }
    int kv_dim() const { return n_head_kv * head_dim; }
};

struct LayerWeights {
    const float *attn_norm; // (dim)
    Matrix wq;              // (q_dim, dim)
    Matrix wk;              // (kv_dim, dim)
    Matrix wv;              // (kv_dim, dim)
    Matrix wo;              // (dim, q_dim)
    const float *ffn_norm;  // (dim)
    Matrix w_gate;          // (ff, dim)
    Matrix w_up;            // (ff, dim)
    Matrix w_down;          // (dim, ff)
};

struct Model {
    HParams hp;
    Matrix tok_embd;             // (vocab, dim)
    const float *output_norm;    // (dim)
    Matrix output;               // (vocab, dim); token_embd when the model ties them
    std::vector<float> inv_freq; // (rope_dim / 2) RoPE frequency per pair
    std::vector<LayerWeights> layers;
    uint64_t weight_bytes = 0;

    // Binds the weights of a GGUF whose architecture the caller checked is `llama`;
    // nullptr with *error on any mismatch.
    static std::unique_ptr<Model> load(const GGUFFile &file, int n_vocab, std::string *error);
};

// One session's attention memory: keys and values as f16, (layer, n_ctx, kv_dim).
struct KVCache {
    int n_ctx = 0;
    std::unique_ptr<uint16_t[]> k;
    std::unique_ptr<uint16_t[]> v;
    static uint64_t bytes_per_token(const HParams &hp) { return 2ull * hp.n_layer * hp.kv_dim() * sizeof(uint16_t); }
};

// One token of a forward batch.
struct BatchToken {
    KVCache *kv;
    int32_t token;
    int32_t pos;   // its position in kv; positions 0..pos-1 must already be there
    bool logits;   // compute next-token logits after this token
};

// Scratch activations, shared by all sessions (one forward runs at a time).
struct Workspace {
    std::vector<float> x, xb, q, k, v, att, hb, hb2, logits_in;
    std::vector<BlockQ8A> xq;
    int capacity = 0;
    void reserve(const HParams &hp, int n_tokens);
};

constexpr int kMaxBatch = 256; // tokens per forward pass; longer prefills are chunked

// Runs the tokens through the model, writing their K/V into their caches and,
// for every token with `logits` set, n_vocab logits (in batch order) to `logits`.
void forward(const Model &model, const BatchToken *batch, int n, Workspace &ws,
             ThreadPool &pool, float *logits);

// y (n × w.rows) = x (n × w.cols) · wᵀ, split across the pool. Exposed for tests.
void matmul(const Matrix &w, const float *x, int n, float *y, std::vector<BlockQ8A> &xq,
            ThreadPool &pool);

} // namespace llmd
