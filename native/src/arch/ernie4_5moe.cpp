// arch/ernie4_5moe.cpp — ERNIE 4.5 MoE (ernie4_5-moe, e.g. ERNIE-4.5-21B-A3B): ERNIE
// 4.5's attention (arch/ernie4_5.cpp), and after leading_dense_block_count dense
// layers, every interleave_moe_layer_step-th layer has a mixture of experts in place
// of the dense FFN: softmax routing to expert_used_count SwiGLU experts, chosen by
// probability plus exp_probs_b where the file has it, weights renormalised; plus a
// shared expert (expert_shared_feed_forward_length wide, when the file sets it) that
// every token runs, unweighted.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN and experts' scales out
    b.shexp_gated = false;
    b.expert_widths_per_layer = true;
    if (b.file.find(b.prefix + "expert_feed_forward_length") == nullptr) // llama.cpp requires it
        b.fail("model metadata lacks " + b.prefix + "expert_feed_forward_length");
    b.moe_hparams(hp);
    hp.n_ff_shexp = b.get_int(b.prefix + "expert_shared_feed_forward_length", 0, false);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int lead = b.get_int(b.prefix + "leading_dense_block_count", 0, false);
    const int step = b.get_int(b.prefix + "interleave_moe_layer_step", 0, true);
    if (!b.error->empty()) return;
    if (step < 1) {
        b.fail("model metadata " + b.prefix + "interleave_moe_layer_step must be positive");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases
        b.unapplied_vector(blk + "attn_output.bias", hp.n_embd);
        if (l < lead || (l + 1) % step != 0) {
            b.gated_ffn(hp, l, L);
            continue;
        }
        b.moe_ffn(hp, l, L);
        L.expert_bias = b.vector(blk + "exp_probs_b.bias", hp.n_expert, false);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::adjacent);
    ffn_sublayer(p, L); // dense, or x += Σ weight · swiglu expert(rmsnorm(x)) + the shared expert
}

} // namespace

const Arch kErnie45Moe{"ernie4_5-moe", load_hparams, bind, layer};

} // namespace llmd
