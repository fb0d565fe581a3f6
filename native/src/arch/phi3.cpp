// arch/phi3.cpp — Phi-3 and Phi-4-mini: the Llama block with Q, K and V in one
// matrix (attn_qkv, or three as usual), gate and up in one (ffn_up, gate rows
// first), NEOX RoPE over the first rope_dim dims of each head (partial rotary), and
// LongRoPE: per-pair divisors for contexts up to the original one (short) and beyond
// (long), Model::set_context picking them, with cos and sin scaled by attn_factor.
// A sliding window, when the file gives one, applies to every layer.
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    const std::string &p = b.prefix;
    const int window = b.get_int(p + "attention.sliding_window", 0, false); // 0: none (Phi-4)
    hp.window.assign(hp.n_layer, window);
    hp.n_ctx_orig = b.get_int(p + "rope.scaling.original_context_length", hp.n_ctx_train, false);
    hp.rope_mscale = b.get_float(p + "rope.scaling.attn_factor", 1.0f);
    if (!(hp.rope_mscale > 0.0f) || !std::isfinite(hp.rope_mscale) || hp.n_ctx_orig < 1)
        b.fail("model RoPE attn_factor or original context length is invalid");
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    if (b.file.tensor("rope_factors_long.weight") != nullptr || b.file.tensor("rope_factors_short.weight") != nullptr) {
        m.rope_long = b.vector("rope_factors_long.weight", hp.rope_dim / 2);
        m.rope_short = b.vector("rope_factors_short.weight", hp.rope_dim / 2);
        for (int i = 0; m.rope_long != nullptr && m.rope_short != nullptr && i < hp.rope_dim / 2; ++i)
            if (!(m.rope_long[i] > 0.0f) || !(m.rope_short[i] > 0.0f))
                b.fail("model LongRoPE factors must be positive");
    }
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        L.attn_norm = b.vector(blk + "attn_norm.weight", dim);
        if (b.file.tensor(blk + "attn_qkv.weight") != nullptr) {
            b.fused(blk + "attn_qkv.weight", dim, {{hp.q_dim(), &L.wq}, {hp.kv_dim(), &L.wk}, {hp.kv_dim(), &L.wv}});
        } else {
            b.matrix(blk + "attn_q.weight", dim, hp.q_dim(), &L.wq);
            b.matrix(blk + "attn_k.weight", dim, hp.kv_dim(), &L.wk);
            b.matrix(blk + "attn_v.weight", dim, hp.kv_dim(), &L.wv);
        }
        b.matrix(blk + "attn_output.weight", hp.q_dim(), dim, &L.wo);
        L.ffn_norm = b.vector(blk + "ffn_norm.weight", dim);
        b.fused(blk + "ffn_up.weight", dim, {{hp.n_ff, &L.w_gate}, {hp.n_ff, &L.w_up}});
        b.matrix(blk + "ffn_down.weight", hp.n_ff, dim, &L.w_down);
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
    matmuls(p, xb, {project(L.wq, q), project(L.wk, k), project(L.wv, v)}); // rows of attn_qkv
    rope(p, q, p.hp.n_head, Rope::neox);
    rope(p, k, p.hp.n_head_kv, Rope::neox);
    attend(p, l);                           // att = softmax(q kᵀ / √hd) v
    matmuls(p, att, {residual(L.wo, x)});   // x += att woᵀ

    // feed-forward
    rmsnorm_rows(p, xb, x, L.ffn_norm);
    matmuls(p, xb, {swiglu(L.w_gate, L.w_up, hb, hb2)}); // hb = silu(xb gateᵀ) * (xb upᵀ), rows of ffn_up
    matmuls(p, hb, {residual(L.w_down, x)}); // x += hb downᵀ
}

} // namespace

const Arch kPhi3{"phi3", load_hparams, bind, layer};

} // namespace llmd
