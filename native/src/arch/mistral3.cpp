// arch/mistral3.cpp — Mistral 3 (Ministral 3, Mistral Small 3.x as llama.cpp converts
// them): the `llama` architecture's tensors and block (arch/llama.cpp: biases where the
// file has them, rope_freqs, experts of feed_forward_length in place of the FFN), plus
// what Mistral 3 files set: YaRN's ramp (yarn_beta_fast, yarn_beta_slow) and magnitude
// (yarn_log_multiplier) of their own, and Llama 4's attention temperature
// (attention.temperature_scale): past each original context's length of positions,
// queries grow by a logarithmic factor.
#include "arch/arch.h"

#include <cmath>

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    kLlama.load_hparams(b, hp);
    hp.yarn_beta_fast = b.get_float(b.prefix + "rope.scaling.yarn_beta_fast", hp.yarn_beta_fast);
    hp.yarn_beta_slow = b.get_float(b.prefix + "rope.scaling.yarn_beta_slow", hp.yarn_beta_slow);
    hp.yarn_log_mul = b.get_float(b.prefix + "rope.scaling.yarn_log_multiplier", 0.0f);
    hp.attn_temp_scale = b.get_float(b.prefix + "attention.temperature_scale", 0.0f);
    // the context YaRN's original is, as llama.cpp takes it for the temperature's step
    hp.attn_temp_floor = b.get_int(b.prefix + "rope.scaling.original_context_length", hp.n_ctx_train, false);
    if (!b.error->empty()) return;
    if (!(hp.yarn_beta_fast > 0.0f) || !(hp.yarn_beta_slow > 0.0f) || !std::isfinite(hp.yarn_beta_fast) ||
        !std::isfinite(hp.yarn_beta_slow) || !std::isfinite(hp.yarn_log_mul) || !std::isfinite(hp.attn_temp_scale))
        b.fail("model YaRN or attention temperature metadata is invalid");
    else if (hp.attn_temp_scale != 0.0f && hp.attn_temp_floor < 1)
        b.fail("model metadata " + b.prefix + "rope.scaling.original_context_length must be positive for the attention temperature");
}

void bind(Binder &b, Model &m) { kLlama.bind(b, m); }

void layer(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    if (hp.attn_temp_scale == 0.0f) {
        kLlama.layer(p, L, l);
        return;
    }
    project_qkv(p, L); // q, k, v of rmsnorm(x)
    rope(p, p.q, hp.n_head, Rope::adjacent);
    rope(p, p.k, hp.n_head_kv, Rope::adjacent);
    for (int t = 0; t < p.n; ++t) { // the temperature of the token's position
        const float steps = std::floor(static_cast<float>(p.batch[t].pos) / static_cast<float>(hp.attn_temp_floor));
        const float temp = std::log(steps + 1.0f) * hp.attn_temp_scale + 1.0f;
        float *q = p.q + static_cast<size_t>(t) * hp.q_dim();
        for (int i = 0; i < hp.q_dim(); ++i) q[i] *= temp;
    }
    attend(p, l);                                   // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x, L.bo)}); // x += att woᵀ (+ bo)
    ffn_sublayer(p, L); // dense, or x += Σ weight · swiglu expert(rmsnorm(x))
}

} // namespace

const Arch kMistral3{"mistral3", load_hparams, bind, layer};

} // namespace llmd
