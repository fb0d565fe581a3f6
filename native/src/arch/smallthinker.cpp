// arch/smallthinker.cpp — SmallThinker (e.g. SmallThinker-21BA3B): the Llama block
// with NEOX RoPE and optional q/k/v biases, and in place of the FFN a mixture of
// ReGLU experts (relu(gate) · up) whose router reads the layer's input before the
// attention, not the FFN's normed input; expert_gating_func picks the probabilities
// (model.h: Binder::moe_gating), and the chosen weights are renormalised. Files with a
// sliding window attend over 4096 positions in three layers of four
// (attention.sliding_window_pattern, the first of each four global), and those global
// layers have no RoPE; llama.cpp fixes the window and the interval, and so does llmd.
// The local layers turn by rope.freq_base_swa where the file gives it, scaled by the
// file's trained factor as gpt-oss's are (model.h: HParams::LocalRope).
#include "arch/arch.h"

#include <algorithm>
#include <cstring>

namespace llmd {
namespace {

constexpr int kWindow = 4096;   // of the sliding-window layers, whatever the file says
constexpr int kNoRopeStep = 4;  // every fourth layer has no RoPE, when the file has a window

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its experts' scales out
    b.expert_widths_per_layer = true;
    b.moe_hparams(hp);
    b.moe_gating(hp, true); // llama.cpp has no default to run
    hp.expert_glu = Glu::relu;
    if (b.get_int(b.prefix + "attention.sliding_window", 0, false) == 0) return; // every layer global, with RoPE
    const std::vector<bool> local = b.swa_layers(hp.n_layer, 4, true);
    if (!b.error->empty()) return;
    for (int l = 0; l < hp.n_layer; ++l) hp.window[l] = local[l] ? kWindow : 0;
    b.swa_rope(hp, hp.rope_base, HParams::LocalRope::scaled);
}

void bind(Binder &b, Model &m) {
    for (int l = 0; l < m.hp.n_layer; ++l) {
        b.attention(m.hp, l, m.layers[l]); // with optional q/k/v biases
        b.moe_ffn(m.hp, l, m.layers[l]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    const bool sliding = std::any_of(hp.window.begin(), hp.window.end(), [](int w) { return w > 0; });
    const bool nope = sliding && hp.n_layer != kNoRopeStep && l % kNoRopeStep == 0;
    std::vector<float> &route = p.ws.moe_route; // the router's input: x as the layer found it
    route.resize(static_cast<size_t>(p.n) * hp.n_embd);
    std::memcpy(route.data(), p.x, route.size() * sizeof(float));

    project_qkv(p, L); // q, k, v of rmsnorm(x)
    if (!nope) { // the local layers by their own angles
        rope(p, p.q, hp.n_head, Rope::neox, hp.window[l] > 0);
        rope(p, p.k, hp.n_head_kv, Rope::neox, hp.window[l] > 0);
    }
    attend(p, l);                             // att = softmax(q kᵀ / √hd) v over the window
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += att woᵀ

    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    moe(p, L, p.xb, p.x, route.data()); // x += Σ weight · reglu expert(xb), routed by the layer's input
}

} // namespace

const Arch kSmallThinker{"smallthinker", load_hparams, bind, layer};

} // namespace llmd
