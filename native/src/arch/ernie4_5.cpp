// arch/ernie4_5.cpp — ERNIE 4.5 (dense, e.g. ERNIE-4.5-0.3B): the Llama block
// (adjacent-pair RoPE, SwiGLU FFN) with optional q/k/v biases. An attention output
// bias is loaded and left out, as llama.cpp's graph of this family leaves it.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
}

void bind(Binder &b, Model &m) {
    for (int l = 0; l < m.hp.n_layer; ++l) {
        b.attention(m.hp, l, m.layers[l]); // with optional q/k/v biases
        b.unapplied_vector("blk." + std::to_string(l) + ".attn_output.bias", m.hp.n_embd);
        b.gated_ffn(m.hp, l, m.layers[l]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::adjacent);
    swiglu_ffn(p, L);
}

} // namespace

const Arch kErnie45{"ernie4_5", load_hparams, bind, layer};

} // namespace llmd
