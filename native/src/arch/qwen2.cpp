// arch/qwen2.cpp — Qwen2 and Qwen2.5: the Llama block with biases on the q/k/v
// projections, NEOX RoPE (each head's halves rotate together) and an optional
// bias on the output head.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
}

void bind(Binder &b, Model &m) {
    m.output_b = b.vector("output.bias", m.hp.n_vocab, false);
    for (int l = 0; l < m.hp.n_layer; ++l) {
        b.attention(m.hp, l, m.layers[l]); // q/k/v biases as the file has them
        b.gated_ffn(m.hp, l, m.layers[l]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::neox);
    swiglu_ffn(p, L);
}

} // namespace

const Arch kQwen2{"qwen2", load_hparams, bind, layer};

} // namespace llmd
