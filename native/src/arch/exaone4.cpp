// arch/exaone4.cpp — EXAONE 4.0: no norm before a sublayer, an RMS norm of its output
// before it joins the residual (post_attention_norm, post_ffw_norm), RMS norms over
// each query and key head, NEOX RoPE (with rope_freqs where the file has them);
// q/k/v biases are optional. The 64-layer model (32B) attends over a sliding window
// (attention.sliding_window, else 4096) in three layers of four, and only those turn
// by RoPE: its global layers have none. llama.cpp decides this by the layer count,
// and so does llmd. Multi-token-prediction blocks (nextn_predict_layers) are loaded
// into Model::nextn, not run (llama.cpp drafts with no EXAONE block).
#include "arch/arch.h"

namespace llmd {
namespace {

constexpr int kSlidingLayers = 64; // the one model with sliding-window layers

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    if (hp.n_layer != kSlidingLayers) return;
    const std::vector<bool> local = b.swa_layers(hp.n_layer, 4);
    const int window = b.get_int(b.prefix + "attention.sliding_window", 4096, false);
    if (!b.error->empty()) return;
    if (window < 1) {
        b.fail("model metadata " + b.prefix + "attention.sliding_window must be positive");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? window : 0;
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) b.post_norm_block(hp, l, m.layers[l], hp.head_dim, hp.head_dim);
    for (int i = 0; i < hp.n_layer_nextn; ++i) {
        b.post_norm_block(hp, hp.n_layer + i, m.nextn[i].block, hp.head_dim, hp.head_dim);
        b.nextn(hp, hp.n_layer + i, m.nextn[i]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    // attention, of x itself
    matmuls(p, p.x, {project(L.wq, p.q, L.bq), project(L.wk, p.k, L.bk), project(L.wv, p.v, L.bv)});
    rmsnorm_heads(p, p.q, hp.n_head, L.q_norm);
    rmsnorm_heads(p, p.k, hp.n_head_kv, L.k_norm);
    if (hp.n_layer != kSlidingLayers || hp.window[l] > 0) {
        rope(p, p.q, hp.n_head, Rope::neox);
        rope(p, p.k, hp.n_head_kv, Rope::neox);
    }
    post_norm_rest(p, l, L); // attention over the window, out-projection, norm, residual; the FFN
}

} // namespace

const Arch kExaone4{"exaone4", load_hparams, bind, layer};

} // namespace llmd
