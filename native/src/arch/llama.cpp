// arch/llama.cpp — Llama 2/3.x, Mistral, SmolLM2: pre-norm attention with adjacent-
// pair RoPE and a SwiGLU FFN. Q/K/V/O and FFN biases are optional (some fine-tunes
// and converted models carry them); Llama-3 frequency factors and RoPE scaling are
// shared keys, read by Model::load.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &, HParams &) {} // only the keys every decoder has

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        L.attn_norm = b.vector(blk + "attn_norm.weight", dim);
        b.matrix(blk + "attn_q.weight", dim, hp.q_dim(), &L.wq);
        b.matrix(blk + "attn_k.weight", dim, hp.kv_dim(), &L.wk);
        b.matrix(blk + "attn_v.weight", dim, hp.kv_dim(), &L.wv);
        b.matrix(blk + "attn_output.weight", hp.q_dim(), dim, &L.wo);
        L.bq = b.vector(blk + "attn_q.bias", hp.q_dim(), false);
        L.bk = b.vector(blk + "attn_k.bias", hp.kv_dim(), false);
        L.bv = b.vector(blk + "attn_v.bias", hp.kv_dim(), false);
        L.bo = b.vector(blk + "attn_output.bias", dim, false);
        L.ffn_norm = b.vector(blk + "ffn_norm.weight", dim);
        b.matrix(blk + "ffn_gate.weight", dim, hp.n_ff, &L.w_gate);
        b.matrix(blk + "ffn_up.weight", dim, hp.n_ff, &L.w_up);
        b.matrix(blk + "ffn_down.weight", hp.n_ff, dim, &L.w_down);
        L.b_gate = b.vector(blk + "ffn_gate.bias", hp.n_ff, false);
        L.b_up = b.vector(blk + "ffn_up.bias", hp.n_ff, false);
        L.b_down = b.vector(blk + "ffn_down.bias", dim, false);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    Workspace &ws = p.ws;
    float *x = ws.x.data();     // (n, dim) residual stream
    float *xb = ws.xb.data();   // (n, dim) normed input of a sublayer
    float *q = ws.q.data();     // (n, n_head * head_dim)
    float *k = ws.k.data();     // (n, n_head_kv * head_dim)
    float *v = ws.v.data();     // (n, n_head_kv * head_dim)
    float *att = ws.att.data(); // (n, n_head * head_dim)
    float *hb = ws.hb.data();   // (n, ff)
    float *hb2 = ws.hb2.data(); // (n, ff) scratch of the SwiGLU

    // attention
    rmsnorm_rows(p, xb, x, L.attn_norm);
    matmuls(p, xb, {project(L.wq, q, L.bq), project(L.wk, k, L.bk), project(L.wv, v, L.bv)});
    rope(p, q, p.hp.n_head, Rope::adjacent);
    rope(p, k, p.hp.n_head_kv, Rope::adjacent);
    attend(p, l);                                     // att = softmax(q kᵀ / √hd) v
    matmuls(p, att, {residual(L.wo, x, L.bo)});       // x += att woᵀ

    // feed-forward
    rmsnorm_rows(p, xb, x, L.ffn_norm);
    matmuls(p, xb, {swiglu(L.w_gate, L.w_up, hb, hb2, L.b_gate, L.b_up)}); // hb = silu(xb gateᵀ) * (xb upᵀ)
    matmuls(p, hb, {residual(L.w_down, x, L.b_down)}); // x += hb downᵀ
}

} // namespace

const Arch kLlama{"llama", load_hparams, bind, layer};

} // namespace llmd
