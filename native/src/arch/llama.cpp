// arch/llama.cpp — the `llama` architecture: Llama 2/3.x, Mistral, SmolLM2, and Mixtral.
// Pre-norm attention with adjacent-pair RoPE and a SwiGLU FFN. Q/K/V/O and FFN
// biases are optional (some fine-tunes and converted models carry them); Llama-3
// frequency factors and RoPE scaling are shared keys, read by Model::load. (The file
// is not named llama.cpp so that it is never taken for that project's source.)
#include "arch/arch.h"

namespace llmd {
namespace {

// Mixtral's files are llama files that count experts: a mixture of experts as wide as
// feed_forward_length in place of the FFN, its softmax router's top expert_used_count
// renormalised (as llama.cpp runs them, whatever else the file says of experts).
void load_hparams(Binder &b, HParams &hp) {
    if (b.get_int(b.prefix + "expert_count", 0, false) == 0) return;
    b.moe_hparams(hp);
    hp.n_ff_exp = hp.n_ff;
    hp.n_ff_shexp = 0; // llama files have no shared expert: its tensors stay unbound, and refused
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // with optional q/k/v biases
        L.bo = b.vector(blk + "attn_output.bias", hp.n_embd, false);
        if (hp.n_expert > 0) {
            b.moe_ffn(hp, l, L);
            continue;
        }
        b.gated_ffn(hp, l, L);
        b.ffn_biases(hp, l, L);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::adjacent);
    ffn_sublayer(p, L); // dense, or (Mixtral) x += Σ weight · swiglu expert(rmsnorm(x))
}

} // namespace

const Arch kLlama{"llama", load_hparams, bind, layer};

} // namespace llmd
