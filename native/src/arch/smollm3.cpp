// arch/smollm3.cpp — SmolLM3: the Llama block, except that every fourth layer
// (3, 7, 11, ...) attends without RoPE. The interval is fixed by the model, not
// stored in its files (llama.cpp hard-codes it too).
#include "arch/arch.h"

namespace llmd {
namespace {

constexpr int kNoRopeInterval = 4;

void load_hparams(Binder &b, HParams &) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
}

void bind(Binder &b, Model &m) {
    for (int l = 0; l < m.hp.n_layer; ++l) {
        b.attention(m.hp, l, m.layers[l]);
        b.gated_ffn(m.hp, l, m.layers[l]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    project_qkv(p, L); // q, k, v of rmsnorm(x)
    if ((l + 1) % kNoRopeInterval != 0) {
        rope(p, p.q, p.hp.n_head, Rope::adjacent);
        rope(p, p.k, p.hp.n_head_kv, Rope::adjacent);
    }
    attend(p, l);                             // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += att woᵀ
    swiglu_ffn(p, L);
}

} // namespace

const Arch kSmolLM3{"smollm3", load_hparams, bind, layer};

} // namespace llmd
