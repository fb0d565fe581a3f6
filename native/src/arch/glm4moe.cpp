// arch/glm4moe.cpp — GLM-4.5, GLM-4.5-Air, GLM-4.6 (and their MoE kin): a pre-norm block
// with q/k/v biases, RMS norms over each query and key head where the file has them,
// NEOX RoPE over rope.dimension_count dims of each head (or GLM-4's multi-section RoPE of
// text positions: glm4.cpp reads the metadata); the FFN normed by post_attention_norm,
// as the family names it. The first leading_dense_block_count layers have a dense
// SwiGLU FFN; the others route to experts: the sigmoid of each router score (unless
// expert_gating_func says otherwise), the top expert_used_count chosen by that plus
// exp_probs_b, their weights renormalised as expert_weights_norm says and scaled by
// expert_weights_scale; plus expert_shared_count shared experts, one ungated SwiGLU of
// that many times the experts' width. Files may end with multi-token-prediction blocks
// (nextn_predict_layers) of the same MoE block; the first drafts (model.h: forward_nextn).
#include "arch/arch.h"

#include <limits>

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    kGlm4.load_hparams(b, hp); // FFN scales left out, as for GLM-4; RoPE sections
    b.expert_widths_per_layer = true;
    b.shexp_gated = false;
    if (b.file.find(b.prefix + "expert_feed_forward_length") == nullptr) // llama.cpp requires it
        b.fail("model metadata lacks " + b.prefix + "expert_feed_forward_length");
    b.moe_hparams(hp);
    b.moe_weighting(hp, false);
    const int shared = b.get_int(b.prefix + "expert_shared_count", 0, true);
    if (b.get_int(b.prefix + "expert_gating_func", 0, false) == 0)
        hp.gating = HParams::Gating::sigmoid; // llama.cpp's default for the family
    else
        b.moe_gating(hp, true);
    if (!b.error->empty()) return;
    const int64_t width = static_cast<int64_t>(shared) * hp.n_ff_exp;
    if (shared < 0 || shared > hp.n_expert || width > std::numeric_limits<int>::max()) {
        b.fail("model metadata " + b.prefix + "expert_shared_count is out of range");
        return;
    }
    hp.n_ff_shexp = static_cast<int>(width);
}

// Block l: its attention, then a dense FFN in the first `lead` layers, else the experts.
void bind_block(Binder &b, const HParams &hp, int l, int lead, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    b.attention(hp, l, L); // q/k/v, or one attn_qkv, with their biases
    L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim, false);
    L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim, false);
    if ((L.q_norm == nullptr) != (L.k_norm == nullptr))
        b.fail("layer " + std::to_string(l) + " has a norm over its query heads or its key heads, not both");
    if (l < lead) {
        b.gated_ffn(hp, l, L, "post_attention_norm");
    } else {
        b.moe_ffn(hp, l, L, "post_attention_norm");
        L.expert_bias = b.vector(blk + "exp_probs_b.bias", hp.n_expert);
    }
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int lead = b.get_int(b.prefix + "leading_dense_block_count", 0, false);
    for (int l = 0; l < hp.n_layer; ++l) bind_block(b, hp, l, lead, m.layers[l]);
    for (int i = 0; i < hp.n_layer_nextn; ++i) {
        bind_block(b, hp, hp.n_layer + i, lead, m.nextn[i].block);
        b.nextn(hp, hp.n_layer + i, m.nextn[i]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    if (L.q_norm != nullptr) qk_norm_attention(p, L, l);
    else rope_attention(p, L, l, Rope::neox);
    ffn_sublayer(p, L); // dense, or x += Σ weight · swiglu expert(rmsnorm(x)) + the shared experts
}

} // namespace

const Arch kGlm4Moe{"glm4moe", load_hparams, bind, layer};

} // namespace llmd
