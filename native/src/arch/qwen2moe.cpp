// arch/qwen2moe.cpp — Qwen1.5-MoE and Qwen2-MoE: Qwen2's attention (q/k/v biases,
// NEOX RoPE) and a mixture of experts whose chosen weights are left as the softmax
// gave them (unless the file sets expert_weights_norm), plus a shared SwiGLU expert
// that every token runs, weighted by sigmoid(xb · ffn_gate_inp_shexp).
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its experts' scales out
    b.moe_hparams(hp);
    b.moe_weighting(hp, false);
    if (hp.n_ff_shexp == 0) b.fail("model lacks tensor blk.0.ffn_up_shexp.weight (qwen2moe's shared expert)");
}

void bind(Binder &b, Model &m) {
    for (int l = 0; l < m.hp.n_layer; ++l) {
        b.attention(m.hp, l, m.layers[l]); // q/k/v biases as the file has them
        b.moe_ffn(m.hp, l, m.layers[l]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::neox);
    ffn_sublayer(p, L); // x += Σ weight · swiglu expert(rmsnorm(x)) + the shared expert
}

} // namespace

const Arch kQwen2Moe{"qwen2moe", load_hparams, bind, layer};

} // namespace llmd
