// arch/qwen35moe.cpp — Qwen3.5 MoE (Qwen3.5-35B-A3B and larger): Qwen3.5's hybrid
// layers (Gated DeltaNet layers and gated attention, qwen35.cpp; Binder::delta_net_*)
// with, in place of the dense FFN, Qwen3-MoE's routed experts (softmax router, the top
// expert_used_count renormalised, as llama.cpp computes this family whatever the file
// says of weights norm and scale) plus the shared expert every token runs behind its
// sigmoid gate, as Qwen2-MoE's. Files may end with multi-token-prediction blocks
// (nextn_predict_layers): gated attention and the same MoE over eh_proj of the normed
// embedding and hidden state; the first drafts (model.h: forward_nextn).
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.delta_net_hparams(hp);
    b.moe_hparams(hp);
    if (b.error->empty() && hp.n_ff_shexp == 0)
        b.fail("model lacks tensor blk.0.ffn_up_shexp.weight (qwen35moe's shared expert)");
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        b.delta_net_mixer(hp, l, m.layers[l]);
        b.moe_ffn(hp, l, m.layers[l], "post_attention_norm"); // the FFN's norm, by Qwen3.5's name
    }
    for (int i = 0; i < hp.n_layer_nextn; ++i) {
        NextNWeights &N = m.nextn[i];
        b.delta_net_mixer(hp, hp.n_layer + i, N.block);
        b.moe_ffn(hp, hp.n_layer + i, N.block, "post_attention_norm");
        b.nextn(hp, hp.n_layer + i, N);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    if (p.hp.recurrent(l)) gated_delta_net(p, L, l);
    else gated_attention(p, L, l);
    ffn_sublayer(p, L); // x += Σ weight · swiglu expert(rmsnorm(x)) + the shared expert
}

} // namespace

const Arch kQwen35Moe{"qwen35moe", load_hparams, bind, layer};

} // namespace llmd
