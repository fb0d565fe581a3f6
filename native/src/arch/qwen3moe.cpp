// arch/qwen3moe.cpp — Qwen3 MoE: Qwen3's attention (an RMS norm over each query and
// key head before NEOX RoPE) and, in place of the dense FFN, a mixture of experts:
// the router's softmax picks expert_used_count of expert_count SwiGLU experts per
// token, their weights renormalised (unless expert_weights_norm is false) and scaled
// by expert_weights_scale when the file sets one.
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    const std::string &p = b.prefix;
    hp.n_expert = b.get_int(p + "expert_count", 0, true);
    hp.n_expert_used = b.get_int(p + "expert_used_count", 0, true);
    if (hp.n_expert < 1 || hp.n_expert > 4096 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert) {
        b.fail("model expert counts are inconsistent (" + std::to_string(hp.n_expert_used) + " of " +
               std::to_string(hp.n_expert) + ")");
        return;
    }
    hp.n_ff_exp = b.get_int(p + "expert_feed_forward_length", hp.n_ff / hp.n_expert_used, false);
    std::string err;
    bool norm = true;
    if (!b.file.get_bool(p + "expert_weights_norm", &norm, &err) && !err.empty()) b.fail(err);
    hp.expert_norm = norm;
    const float scale = b.get_float(p + "expert_weights_scale", 0.0f);
    hp.expert_scale = scale == 0.0f ? 1.0f : scale; // 0, as files write "none", scales by 1
    if (hp.n_ff_exp < 1 || !std::isfinite(hp.expert_scale)) b.fail("model expert FFN length or weight scale is invalid");
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases
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
    qk_norm_attention(p, L, l);
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    moe(p, L, p.xb, p.x); // x += Σ weight · swiglu expert(xb)
}

} // namespace

const Arch kQwen3Moe{"qwen3moe", load_hparams, bind, layer};

} // namespace llmd
