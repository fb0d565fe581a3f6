// arch/granite.cpp — IBM Granite: 3.x dense and MoE (`granite`, `granitemoe`:
// granite-3.3-2b, 3.1-3b-a800m, ...) and 4.0-H (`granitehybrid`: granite-4.0-h-micro,
// h-tiny, h-small). Attention with optional q/k/v and output biases and adjacent-pair
// RoPE (none in granite and granitehybrid files whose rope.scaling.finetuned is false,
// as Granite 4.0-H's files say), and in 4.0-H Mamba-2 layers (recurrent.h: mamba2)
// where attention.head_count_kv is 0; then a SwiGLU feed-forward with optional biases,
// or, in files that count experts, a mixture of SwiGLU experts as wide as
// feed_forward_length (softmax router, the top expert_used_count renormalised, as
// llama.cpp runs this family whatever the file says of gating and expert weights) plus
// an ungated shared expert of expert_shared_feed_forward_length when the file gives
// one. Granite's multipliers: embeddings times embedding_scale, each sublayer's output
// times residual_scale before it joins the residual, attention scores times
// attention.scale, logits divided by logit_scale (each 1, or 1/√head_dim, when absent).
// llama.cpp's graph of this family leaves the FFN's and experts' per-tensor scales out
// (named in a warning).
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

// One of Granite's multipliers: `fallback` when the file leaves it out or writes 0.
float multiplier(Binder &b, const std::string &key, float fallback) {
    const float v = b.get_float(b.prefix + key, 0.0f);
    if (v == 0.0f) return fallback;
    if (!(v > 0.0f) || !std::isfinite(v)) b.fail("model metadata " + b.prefix + key + " must be positive");
    return v;
}

// What every Granite reads. rope_switch: rope.scaling.finetuned false means no RoPE
// (granite and granitehybrid); llama.cpp's granitemoe reads the key for the record
// alone and always turns queries and keys.
void load_granite(Binder &b, HParams &hp, bool rope_switch) {
    b.ffn_scales = false;   // llama.cpp's graph of this family leaves its FFN and experts' scales out
    b.shexp_gated = false;  // its shared expert has no gate
    hp.embd_scale = multiplier(b, "embedding_scale", 1.0f);
    hp.residual_scale = multiplier(b, "residual_scale", 1.0f);
    hp.logit_scale = multiplier(b, "logit_scale", 1.0f);
    hp.attn_scale = multiplier(b, "attention.scale", 0.0f); // 0: 1/√head_dim
    bool rope = true; // llama.cpp's default for this family
    std::string err;
    if (!b.file.get_bool(b.prefix + "rope.scaling.finetuned", &rope, &err) && !err.empty()) b.fail(err);
    if (rope_switch && !rope) hp.rope_dim = 0; // no pair turns
    if (b.get_int(b.prefix + "expert_count", 0, false) == 0) return;
    b.moe_hparams(hp);
    hp.n_ff_exp = hp.n_ff;
    hp.n_ff_shexp = b.get_int(b.prefix + "expert_shared_feed_forward_length", 0, false); // 0: none
}

// Granite 3.x: every layer attends.
void load_dense(Binder &b, HParams &hp) { load_granite(b, hp, true); }
void load_moe(Binder &b, HParams &hp) { load_granite(b, hp, false); }

// Granite 4.0-H: Mamba-2 layers among them.
void load_hybrid(Binder &b, HParams &hp) {
    b.mamba2_hparams(hp);
    load_granite(b, hp, true);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        LayerWeights &L = m.layers[l];
        b.mamba2_mixer(hp, l, L); // Mamba-2's weights where the layer is recurrent, else attention's
        if (hp.n_expert > 0) {
            b.moe_ffn(hp, l, L);
            continue;
        }
        b.gated_ffn(hp, l, L);
        b.ffn_biases(hp, l, L);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    if (hp.recurrent(l)) {
        rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
        mamba2(p, L, l, p.xb); // xb = the Mamba-2 block's output
    } else {
        project_qkv(p, L); // q, k, v of rmsnorm(x)
        if (hp.rope_dim > 0) {
            rope(p, p.q, hp.n_head, Rope::adjacent);
            rope(p, p.k, hp.n_head_kv, Rope::adjacent);
        }
        attend(p, l);                                  // att = softmax(q kᵀ · scale) v
        matmuls(p, p.att, {project(L.wo, p.xb, L.bo)}); // xb = att woᵀ + bo
    }
    add_rows(p, p.x, p.xb, hp.residual_scale);

    std::vector<float> &ffn = p.ws.sublayer; // the feed-forward's output: xb is its input
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    if (L.router.data != nullptr) {
        ffn.assign(static_cast<size_t>(p.n) * hp.n_embd, 0.0f);
        moe(p, L, p.xb, ffn.data()); // ffn = Σ weight · swiglu expert(xb) + shared expert(xb)
    } else {
        ffn.resize(static_cast<size_t>(p.n) * hp.n_embd);
        matmuls(p, p.xb, {swiglu(L.w_gate, L.w_up, p.hb, p.hb2, L.b_gate, L.b_up)});
        matmuls(p, p.hb, {project(L.w_down, ffn.data(), L.b_down)}); // ffn = down(silu(gate) * up)
    }
    add_rows(p, p.x, ffn.data(), hp.residual_scale);
}

} // namespace

const Arch kGranite{"granite", load_dense, bind, layer};
const Arch kGraniteMoe{"granitemoe", load_moe, bind, layer};
const Arch kGraniteHybrid{"granitehybrid", load_hybrid, bind, layer};

} // namespace llmd
