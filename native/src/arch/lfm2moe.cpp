// arch/lfm2moe.cpp — LFM2-MoE (e.g. LFM2-8B-A1B): LFM2's short-convolution and
// attention blocks (arch/lfm2.cpp) without a sliding window, each followed, after
// leading_dense_block_count dense layers, by a mixture of SwiGLU experts instead of
// the dense FFN: expert_gating_func picks the probabilities (model.h:
// Binder::moe_gating), experts are chosen by probability plus exp_probs_b, and their
// weights renormalised.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN and experts' scales out
    b.short_conv_hparams(hp);
    b.expert_widths_per_layer = true;
    if (b.file.find(b.prefix + "expert_feed_forward_length") == nullptr) // llama.cpp requires it
        b.fail("model metadata lacks " + b.prefix + "expert_feed_forward_length");
    b.moe_hparams(hp);
    b.moe_gating(hp, true);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int lead = b.get_int(b.prefix + "leading_dense_block_count", 0, false);
    b.short_conv_output_norm(m);
    for (int l = 0; l < hp.n_layer; ++l) {
        LayerWeights &L = m.layers[l];
        b.short_conv_mixer(hp, l, L);
        if (l < lead) {
            b.gated_ffn(hp, l, L);
            continue;
        }
        b.moe_ffn(hp, l, L);
        L.expert_bias = b.vector("blk." + std::to_string(l) + ".exp_probs_b.bias", hp.n_expert);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    if (p.hp.recurrent(l)) short_conv(p, L, l);
    else qk_norm_attention(p, L, l);
    ffn_sublayer(p, L); // dense, or x += Σ weight · swiglu expert(rmsnorm(x))
}

} // namespace

const Arch kLfm2Moe{"lfm2moe", load_hparams, bind, layer};

} // namespace llmd
