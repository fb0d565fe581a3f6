// arch/qwen3moe.cpp — Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention (q/k head
// norms, NEOX RoPE) with a mixture-of-experts FFN: a router picks
// expert_used_count of expert_count SwiGLU experts per token (model.h: moe_ffn).
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    const std::string &p = b.prefix;
    hp.n_expert = b.get_int(p + "expert_count", 0, true);
    hp.n_expert_used = b.get_int(p + "expert_used_count", 0, true);
    hp.n_ff_exp = b.get_int(p + "expert_feed_forward_length", 0, false);
    hp.expert_weights_scale = b.get_float(p + "expert_weights_scale", 0.0f);
    if (!b.error->empty()) return;
    if (hp.n_expert < 1 || hp.n_expert > 4096 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert)
        b.fail("model expert counts are inconsistent");
    if (hp.n_ff_exp == 0) hp.n_ff_exp = hp.n_ff / hp.n_expert_used; // as llama.cpp assumes without the key
    if (hp.n_ff_exp < 1 || !std::isfinite(hp.expert_weights_scale)) b.fail("model expert sizes are inconsistent");
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L);
        L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim);
        L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim);
        L.ffn_norm = b.vector(blk + "ffn_norm.weight", dim);
        b.matrix(blk + "ffn_gate_inp.weight", dim, hp.n_expert, &L.router);
        b.experts(blk + "ffn_gate_exps.weight", dim, hp.n_ff_exp, hp.n_expert, &L.gate_exps);
        b.experts(blk + "ffn_up_exps.weight", dim, hp.n_ff_exp, hp.n_expert, &L.up_exps);
        b.experts(blk + "ffn_down_exps.weight", hp.n_ff_exp, dim, hp.n_expert, &L.down_exps);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    project_qkv(p, L); // q, k, v of rmsnorm(x)
    rmsnorm_heads(p, p.q, p.hp.n_head, L.q_norm);
    rmsnorm_heads(p, p.k, p.hp.n_head_kv, L.k_norm);
    rope(p, p.q, p.hp.n_head, Rope::neox);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox);
    attend(p, l);                             // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += att woᵀ
    moe_ffn(p, L);                            // x += Σ weight · expert(rmsnorm(x))
}

} // namespace

const Arch kQwen3Moe{"qwen3moe", load_hparams, bind, layer};

} // namespace llmd
