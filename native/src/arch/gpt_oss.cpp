// arch/gpt_oss.cpp — gpt-oss (gpt-oss-20b, gpt-oss-120b; llama.cpp's OPENAI_MOE): the
// Llama block with NEOX RoPE (YaRN-scaled in the published files), q/k/v biases where
// the file has them and an attention output bias, and a learned sink per query head
// whose logit joins each softmax's denominator (attn_sinks). Layers alternate between a
// sliding window (the even ones, by default) and global attention, the local ones
// turned by rope.freq_base_swa where the file gives it and by the file's trained factor
// (YaRN as the global ones; linearly where the scaling type is none, which leaves the
// global ones unscaled: model.h, HParams::LocalRope). The FFN, after
// post_attention_norm (the pre-FFN norm, despite its name), is a mixture of experts:
// the router's scores plus its bias choose expert_used_count experts, weighted by the
// softmax over the chosen scores alone; each expert is gpt-oss's SwiGLU (model.h:
// Glu::swiglu_oai) with biases on gate, up and down, its weights MXFP4 in the
// published files. llama.cpp reads neither expert_gating_func nor
// the expert weights' norm or scale for this family, and applies none of its experts'
// per-tensor scales; llmd neither.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its experts' scales out
    b.expert_widths_per_layer = true;
    if (b.file.find(b.prefix + "expert_feed_forward_length") == nullptr) // llama.cpp requires it
        b.fail("model metadata lacks " + b.prefix + "expert_feed_forward_length");
    b.moe_hparams(hp);
    hp.gating = HParams::Gating::softmax_chosen;
    hp.expert_norm = false;
    hp.expert_glu = Glu::swiglu_oai;
    const int window = b.get_int(b.prefix + "attention.sliding_window", 0, true);
    const std::vector<bool> local = b.swa_layers(hp.n_layer, 2); // even layers local, odd global
    if (!b.error->empty()) return;
    if (window < 1) {
        b.fail("model metadata " + b.prefix + "attention.sliding_window must be positive");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? window : 0;
    b.swa_rope(hp, hp.rope_base, HParams::LocalRope::scaled);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases
        L.bo = b.vector(blk + "attn_output.bias", hp.n_embd);
        L.attn_sinks = b.vector(blk + "attn_sinks.weight", hp.n_head);
        b.moe_ffn(hp, l, L, "post_attention_norm");
        L.router_b = b.vector(blk + "ffn_gate_inp.bias", hp.n_expert);
        L.b_gate_exps = b.filters(blk + "ffn_gate_exps.bias", hp.n_ff_exp, hp.n_expert);
        L.b_up_exps = b.filters(blk + "ffn_up_exps.bias", hp.n_ff_exp, hp.n_expert);
        L.b_down_exps = b.filters(blk + "ffn_down_exps.bias", hp.n_embd, hp.n_expert);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    // x += softmax(q kᵀ / √hd, with the sinks) v woᵀ + bo, over the window
    rope_attention(p, L, l, Rope::neox, p.hp.window[l] > 0);
    ffn_sublayer(p, L); // x += Σ softmax(chosen scores) · swiglu_oai expert(rmsnorm(x))
}

} // namespace

const Arch kGptOss{"gpt-oss", load_hparams, bind, layer};

} // namespace llmd
