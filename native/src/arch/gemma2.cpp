// arch/gemma2.cpp — Gemma 2: embeddings scaled by √n_embd; attention and FFN each
// normed before and after (the post norm's output joins the residual); NEOX RoPE; a
// GELU-gated FFN. Every attention score is soft-capped (attn_logit_softcapping, 50
// when absent: ops/attention.h, AttnScale), and so are the final logits
// (final_logit_softcapping, 30 when absent). The even layers attend over a sliding
// window (attention.sliding_window, 4,096 when absent; the pattern as
// Binder::swa_layers reads it), turned as the global ones unless the file gives them a
// base of their own. Gemma's norms scale by (1 + w); the converted files store 1 + w,
// so every norm here multiplies by the stored weight as it is.
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

// A soft cap of the file's, or `fallback` when absent: positive and finite.
float softcap(Binder &b, const std::string &key, float fallback) {
    const float c = b.get_float(b.prefix + key, fallback);
    if (!(c > 0.0f) || !std::isfinite(c)) b.fail("model metadata " + b.prefix + key + " must be positive");
    return c;
}

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    const std::vector<bool> local = b.swa_layers(hp.n_layer, 2);
    if (!b.error->empty()) return;
    const int window = b.get_int(b.prefix + "attention.sliding_window", 4096, false);
    if (window < 1) {
        b.fail("model metadata " + b.prefix + "attention.sliding_window must be positive");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? window : 0;
    b.swa_rope(hp, hp.rope_base, HParams::LocalRope::scaled);
    hp.attn_softcap = softcap(b, "attn_logit_softcapping", 50.0f);
    hp.logit_softcap = softcap(b, "final_logit_softcapping", 30.0f);
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    // Queries are scaled by query_pre_attn_scalar^-1/2, which the converted files do
    // not store: it is the head size, except for the 27B model (46 layers), whose
    // queries are scaled by n_embd / n_head as the reference implementation says.
    const float scalar = hp.n_layer == 46 ? static_cast<float>(hp.n_embd / hp.n_head) : static_cast<float>(hp.head_dim);
    hp.attn_scale = 1.0f / std::sqrt(scalar);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases, as llama.cpp reads them
        L.attn_post_norm = b.vector(blk + "post_attention_norm.weight", dim);
        b.gated_ffn(hp, l, L);
        L.ffn_post_norm = b.vector(blk + "post_ffw_norm.weight", dim);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const bool local = p.hp.window[l] > 0;

    // attention
    project_qkv(p, L); // q, k, v of rmsnorm(x)
    rope(p, p.q, p.hp.n_head, Rope::neox, local);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox, local);
    attend(p, l);                              // att = softmax(cap(q kᵀ · attn_scale)) v over the window
    matmuls(p, p.att, {project(L.wo, p.xb)});  // xb = att woᵀ
    rmsnorm_rows(p, p.xb, p.xb, L.attn_post_norm);
    add_rows(p, p.x, p.xb);                    // x += norm(att woᵀ)

    // feed-forward
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    matmuls(p, p.xb, {geglu(L.w_gate, L.w_up, p.hb, p.hb2)}); // hb = gelu(xb gateᵀ) * (xb upᵀ)
    matmuls(p, p.hb, {project(L.w_down, p.xb)});               // xb = hb downᵀ
    rmsnorm_rows(p, p.xb, p.xb, L.ffn_post_norm);
    add_rows(p, p.x, p.xb);                                    // x += norm(hb downᵀ)
}

} // namespace

const Arch kGemma2{"gemma2", load_hparams, bind, layer};

} // namespace llmd
