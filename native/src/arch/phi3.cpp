// arch/phi3.cpp — Phi-3, Phi-3.5 and Phi-4-mini: the Llama block with q/k/v fused into
// one attn_qkv matrix (or separate, as some conversions store them), gate and up
// fused into one ffn_up of 2 × ff rows (gate first), NEOX RoPE over the first
// rope_dim dims of each head (partial rotary), and LongRoPE factors read by
// Model::load. Files may state a sliding window; llama.cpp disables it for Phi-3
// and attends over the whole context, and so does llmd, to compute the same model.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    b.get_int(b.prefix + "attention.sliding_window", 0, false); // checked for type only: see above
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L); // q, k and v fused in attn_qkv, or separate
        L.ffn_norm = b.vector(blk + "ffn_norm.weight", dim);
        b.split_matrix(blk + "ffn_up.weight", dim, {{&L.w_gate, hp.n_ff}, {&L.w_up, hp.n_ff}});
        b.matrix(blk + "ffn_down.weight", hp.n_ff, dim, &L.w_down);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    rope_attention(p, L, l, Rope::neox); // over the first rope_dim dims of each head
    swiglu_ffn(p, L);
}

} // namespace

const Arch kPhi3{"phi3", load_hparams, bind, layer};

} // namespace llmd
