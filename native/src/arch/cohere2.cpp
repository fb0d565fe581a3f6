// arch/cohere2.cpp — Command R7B (cohere2): one LayerNorm without bias (the mean
// subtracted; attention.layer_norm_epsilon) before attention and a SwiGLU FFN that run
// in parallel on the same input, x += ffn(h) + attention(h) with h = layernorm(x), and a
// LayerNorm at the end too (HParams::layer_norm). Three layers of four attend over a
// sliding window and turn by RoPE in adjacent pairs (by the model's RoPE base, as
// llama.cpp turns them), the fourth attends globally without RoPE. The output head is
// the embeddings'; the final logits are multiplied by logit_scale.
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    const std::string &p = b.prefix;
    const std::vector<bool> local = b.swa_layers(hp.n_layer, 4);
    const int window = b.get_int(p + "attention.sliding_window", 0, true);
    for (const char *key : {"attention.layer_norm_epsilon", "logit_scale"}) // llama.cpp requires both
        if (b.file.find(p + key) == nullptr) b.fail("model metadata lacks " + p + key);
    if (!b.error->empty()) return;
    if (window < 1) {
        b.fail("model metadata " + p + "attention.sliding_window must be positive");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? window : 0;
    hp.layer_norm = true;
    hp.norm_eps = b.get_float(p + "attention.layer_norm_epsilon", 0.0f);
    const float scale = b.get_float(p + "logit_scale", 0.0f);
    if (!std::isfinite(scale)) {
        b.fail("model metadata " + p + "logit_scale is invalid");
        return;
    }
    if (scale != 0.0f) hp.logit_scale = 1.0f / scale; // 0 leaves the logits as they are, as in llama.cpp
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // attn_norm, q/k/v with optional biases, the output (llama.cpp loads no bias of it)
        b.ffn_weights(hp, l, L);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    layernorm_rows(p, p.xb, p.x, L.attn_norm);
    matmuls(p, p.xb, {project(L.wq, p.q, L.bq), project(L.wk, p.k, L.bk), project(L.wv, p.v, L.bv),
                      swiglu(L.w_gate, L.w_up, p.hb, p.hb2)});
    MatJob down = residual(L.w_down, p.x);
    down.scale_bias = true;
    matmuls(p, p.hb, {down}); // x += down(silu(gate(h)) * up(h)), before the attention as llama.cpp adds them
    if (hp.window[l] > 0) {
        rope(p, p.q, hp.n_head, Rope::adjacent);
        rope(p, p.k, hp.n_head_kv, Rope::adjacent);
    }
    attend(p, l); // att = softmax(q kᵀ / √hd) v over the window, or every position
    matmuls(p, p.att, {residual(L.wo, p.x)});
}

} // namespace

const Arch kCohere2{"cohere2", load_hparams, bind, layer};

} // namespace llmd
