// arch/olmo2.cpp — OLMo 2 and OLMo 3: no norm before a sublayer, an RMS norm of its
// output before it joins the residual (post_attention_norm, post_ffw_norm). Queries
// and keys are RMS-normed over all their heads at once (attn_q_norm spans q_dim,
// attn_k_norm kv_dim), then turned by NEOX RoPE; q/k/v biases are optional. OLMo 3
// files add a sliding window (attention.sliding_window, by default three local layers
// then one global), whose layers turn by the plain frequencies of the global base: as
// llama.cpp's graph turns them, without the file's context scaling (YaRN in OLMo 3's
// long-context files) and without its magnitude correction (YaRN's, attn_factor),
// which only the global layers get.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    const int window = b.get_int(b.prefix + "attention.sliding_window", 0, false);
    if (window == 0) return; // no window, or 0 as "none": every layer global
    const std::vector<bool> local = b.swa_layers(hp.n_layer, 4);
    if (!b.error->empty()) return;
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? window : 0;
    hp.rope_base_local = hp.rope_base; // rope.freq_base_swa, which llama.cpp reads, its graph leaves unused
    hp.rope_local = HParams::LocalRope::plain;
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) b.post_norm_block(hp, l, m.layers[l], hp.q_dim(), hp.kv_dim());
}

// Each token's row of x (n, width) RMS-normed in place and scaled by weight (width).
void rmsnorm_width(const Pass &p, float *x, int width, const float *weight) {
    for (int t = 0; t < p.n; ++t) rmsnorm(x + static_cast<size_t>(t) * width, x + static_cast<size_t>(t) * width, weight,
                                          width, p.hp.norm_eps);
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const bool local = p.hp.window[l] > 0;

    // attention, of x itself
    matmuls(p, p.x, {project(L.wq, p.q, L.bq), project(L.wk, p.k, L.bk), project(L.wv, p.v, L.bv)});
    rmsnorm_width(p, p.q, p.hp.q_dim(), L.q_norm);
    rmsnorm_width(p, p.k, p.hp.kv_dim(), L.k_norm);
    rope(p, p.q, p.hp.n_head, Rope::neox, local);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox, local);
    post_norm_rest(p, l, L); // attention over the window, out-projection, norm, residual; the FFN
}

} // namespace

const Arch kOlmo2{"olmo2", load_hparams, bind, layer};

} // namespace llmd
