// arch/gemma3.cpp — Gemma 3 (text): embeddings scaled by √n_embd; attention and FFN
// each normed before and after (the post norm's output joins the residual); RMS
// norms over each query and key head; NEOX RoPE; a GELU-gated FFN. Layers
// alternate between a sliding window with their own RoPE base and global attention
// (by default five local layers, then one global). The final logits may be
// soft-capped. Gemma's norms scale by (1 + w); the converted files store 1 + w, so
// every norm here multiplies by the stored weight as it is.
#include "arch/arch.h"

#include <cmath>
#include <cstring>

namespace llmd {
namespace {

// Which layers use the sliding window: by default five local layers, then one global
// (Binder::swa_layers).
bool read_pattern(Binder &b, HParams &hp) {
    const std::vector<bool> local = b.swa_layers(hp.n_layer, 6);
    if (!b.error->empty()) return false;
    const int window = b.get_int(b.prefix + "attention.sliding_window", 0, true);
    if (window < 1) return b.fail("model metadata " + b.prefix + "attention.sliding_window must be positive");
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? window : 0;
    return true;
}

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    // A file without a window attends globally in every layer.
    if (b.file.find(b.prefix + "attention.sliding_window") != nullptr && !read_pattern(b, hp)) return;
    // The local layers turn by a base of their own without the file's context scaling,
    // which is for the global layers.
    b.swa_rope(hp, 10000.0f, HParams::LocalRope::unscaled);
    hp.logit_softcap = b.get_float(b.prefix + "final_logit_softcapping", 0.0f);
    if (!(hp.logit_softcap >= 0.0f)) {
        b.fail("model logit soft-cap is invalid");
        return;
    }
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    // Queries are scaled by query_pre_attn_scalar^-1/2, which the converted files do
    // not store: it is the head size, except for the 27B model (62 layers), whose
    // queries are scaled by n_embd / n_head as the reference implementation says.
    const float scalar = hp.n_layer == 62 ? static_cast<float>(hp.n_embd / hp.n_head) : static_cast<float>(hp.head_dim);
    hp.attn_scale = 1.0f / std::sqrt(scalar);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases, as llama.cpp reads them
        L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim);
        L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim);
        L.attn_post_norm = b.vector(blk + "post_attention_norm.weight", dim);
        b.gated_ffn(hp, l, L);
        L.ffn_post_norm = b.vector(blk + "post_ffw_norm.weight", dim);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const bool local = p.hp.window[l] > 0;

    // attention
    project_qkv(p, L); // q, k, v of rmsnorm(x)
    rmsnorm_heads(p, p.q, p.hp.n_head, L.q_norm);
    rmsnorm_heads(p, p.k, p.hp.n_head_kv, L.k_norm);
    rope(p, p.q, p.hp.n_head, Rope::neox, local);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox, local);
    attend(p, l);                              // att = softmax(q kᵀ · attn_scale) v over the window
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

const Arch kGemma3{"gemma3", load_hparams, bind, layer};

} // namespace llmd
