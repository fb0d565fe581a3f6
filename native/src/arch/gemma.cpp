// arch/gemma.cpp — Gemma 1, 2 and 3 (text): embeddings scaled by √n_embd; NEOX RoPE; a
// GELU-gated FFN. Gemma's norms scale by (1 + w); the converted files store 1 + w, so
// every norm here multiplies by the stored weight as it is.
//   gemma:  a pre-norm block, queries scaled by 1/√head_dim, the output head the
//           embeddings' (CodeGemma too).
// Gemma 2 and 3 norm attention and FFN each before and after (the post norm's output
// joins the residual); some layers attend over a sliding window, the others globally.
//   gemma2: every attention score soft-capped (attn_logit_softcapping, 50 when absent:
//           ops/attention.h, AttnScale), and so are the final logits
//           (final_logit_softcapping, 30 when absent); the even layers over a window
//           (attention.sliding_window, 4,096 when absent), turned as the global ones
//           unless the file gives them a base of their own.
//   gemma3: RMS norms over each query and key head; by default five local layers, then
//           one global, the local ones with a RoPE base of their own; the final logits
//           soft-capped where the file says.
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

// Which layers use the sliding window (Binder::swa_layers, by default every period-th
// global) and its width (attention.sliding_window, `fallback` when absent).
bool read_window(Binder &b, HParams &hp, int period, int fallback) {
    const std::vector<bool> local = b.swa_layers(hp.n_layer, period);
    if (!b.error->empty()) return false;
    const int window = b.get_int(b.prefix + "attention.sliding_window", fallback, false);
    if (window < 1) return b.fail("model metadata " + b.prefix + "attention.sliding_window must be positive");
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? window : 0;
    return true;
}

// Queries are scaled by query_pre_attn_scalar^-1/2, which the converted files do not
// store: it is the head size, except for the 27B model (`layers_27b` layers), whose
// queries are scaled by n_embd / n_head as the reference implementation says.
float query_scale(const HParams &hp, int layers_27b) {
    const int scalar = hp.n_layer == layers_27b ? hp.n_embd / hp.n_head : hp.head_dim;
    return 1.0f / std::sqrt(static_cast<float>(scalar));
}

// A soft cap of the file's, or `fallback` when absent: positive and finite.
float softcap(Binder &b, const std::string &key, float fallback) {
    const float c = b.get_float(b.prefix + key, fallback);
    if (!(c > 0.0f) || !std::isfinite(c)) b.fail("model metadata " + b.prefix + key + " must be positive");
    return c;
}

void load_gemma(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
}

void load_gemma2(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    if (!read_window(b, hp, 2, 4096)) return;
    b.swa_rope(hp, hp.rope_base, HParams::LocalRope::scaled);
    hp.attn_softcap = softcap(b, "attn_logit_softcapping", 50.0f);
    hp.logit_softcap = softcap(b, "final_logit_softcapping", 30.0f);
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    hp.attn_scale = query_scale(hp, 46);
}

void load_gemma3(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    // A file without a window attends globally in every layer.
    if (b.file.find(b.prefix + "attention.sliding_window") != nullptr && !read_window(b, hp, 6, 0)) return;
    // The local layers turn by a base of their own without the file's context scaling,
    // which is for the global layers.
    b.swa_rope(hp, 10000.0f, HParams::LocalRope::unscaled);
    hp.logit_softcap = b.get_float(b.prefix + "final_logit_softcapping", 0.0f);
    if (!(hp.logit_softcap >= 0.0f)) {
        b.fail("model logit soft-cap is invalid");
        return;
    }
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    hp.attn_scale = query_scale(hp, 62);
}

// The block's weights, with Gemma 3's query and key head norms when qk_norms.
void bind_block(Binder &b, Model &m, bool qk_norms) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases, as llama.cpp reads them
        if (qk_norms) {
            L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim);
            L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim);
        }
        L.attn_post_norm = b.vector(blk + "post_attention_norm.weight", dim);
        b.gated_ffn(hp, l, L);
        L.ffn_post_norm = b.vector(blk + "post_ffw_norm.weight", dim);
    }
}

void bind_gemma(Binder &b, Model &m) {
    for (int l = 0; l < m.hp.n_layer; ++l) {
        b.attention(m.hp, l, m.layers[l]);
        b.gated_ffn(m.hp, l, m.layers[l]);
    }
}

void bind_gemma2(Binder &b, Model &m) { bind_block(b, m, false); }
void bind_gemma3(Binder &b, Model &m) { bind_block(b, m, true); }

void layer_gemma(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::neox); // x += attention(rmsnorm(x)) woᵀ
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    matmuls(p, p.xb, {geglu(L.w_gate, L.w_up, p.hb, p.hb2)}); // hb = gelu(xb gateᵀ) * (xb upᵀ)
    matmuls(p, p.hb, {residual(L.w_down, p.x)});               // x += hb downᵀ
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const bool local = p.hp.window[l] > 0;

    // attention
    project_qkv(p, L); // q, k, v of rmsnorm(x)
    if (L.q_norm != nullptr) { // Gemma 3 (bound as a pair)
        rmsnorm_heads(p, p.q, p.hp.n_head, L.q_norm);
        rmsnorm_heads(p, p.k, p.hp.n_head_kv, L.k_norm);
    }
    rope(p, p.q, p.hp.n_head, Rope::neox, local);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox, local);
    sandwich_norm_rest(p, l, L); // attention over the window (scores soft-capped: AttnScale), then the FFN
}

} // namespace

const Arch kGemma{"gemma", load_gemma, bind_gemma, layer_gemma};
const Arch kGemma2{"gemma2", load_gemma2, bind_gemma2, layer};
const Arch kGemma3{"gemma3", load_gemma3, bind_gemma3, layer};

} // namespace llmd
