// arch/llama.cpp — the `llama` architecture: Llama 2/3.x, Mistral, SmolLM2.
// Pre-norm attention with adjacent-pair RoPE and a SwiGLU FFN. Q/K/V/O and FFN
// biases are optional (some fine-tunes and converted models carry them); Llama-3
// frequency factors and RoPE scaling are shared keys, read by Model::load. (The file
// is not named llama.cpp so that it is never taken for that project's source.)
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &, HParams &) {} // only the keys every decoder has

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases
        L.bo = b.vector(blk + "attn_output.bias", hp.n_embd, false);
        b.gated_ffn(hp, l, L);
        L.b_gate = b.vector(blk + "ffn_gate.bias", hp.n_ff, false);
        L.b_up = b.vector(blk + "ffn_up.bias", hp.n_ff, false);
        L.b_down = b.vector(blk + "ffn_down.bias", hp.n_embd, false);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::adjacent);
    swiglu_ffn(p, L);
}

} // namespace

const Arch kLlama{"llama", load_hparams, bind, layer};

} // namespace llmd
