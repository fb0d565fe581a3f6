// arch/qwen3moe.cpp — Qwen3 MoE: Qwen3's attention (an RMS norm over each query and
// key head before NEOX RoPE) and, in place of the dense FFN, a mixture of experts:
// the router's softmax picks expert_used_count of expert_count SwiGLU experts per
// token, their weights renormalised (unless expert_weights_norm is false) and scaled
// by expert_weights_scale when the file sets one. A file may add a shared expert
// (ffn_*_shexp) that every token runs behind a sigmoid gate, as Qwen2-MoE's.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.moe_hparams(hp);
    b.moe_weighting(hp, true);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases
        L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim);
        L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim);
        b.moe_ffn(hp, l, L);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    qk_norm_attention(p, L, l);
    ffn_sublayer(p, L); // x += Σ weight · swiglu expert(rmsnorm(x)) (+ the shared expert)
}

} // namespace

const Arch kQwen3Moe{"qwen3moe", load_hparams, bind, layer};

} // namespace llmd
