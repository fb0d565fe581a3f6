// arch/lfm2.cpp — LFM2 (Liquid): short-convolution blocks interleaved with attention.
// A layer whose entry of attention.head_count_kv is 0 is a convolution block (recurrent.h:
// short_conv over shortconv.l_cache positions); the others attend as Qwen3 does (an RMS
// norm over each query and key head, NEOX RoPE), over a sliding window when the file
// gives one. Every layer then has the SwiGLU feed-forward. The final norm is stored as
// token_embd_norm.weight.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    b.short_conv_hparams(hp);
    const int window = b.get_int(b.prefix + "attention.sliding_window", 0, false);
    for (int l = 0; l < hp.n_layer; ++l)
        if (!hp.recurrent(l)) hp.window[l] = window;
}

void bind(Binder &b, Model &m) {
    b.short_conv_output_norm(m);
    for (int l = 0; l < m.hp.n_layer; ++l) {
        b.short_conv_mixer(m.hp, l, m.layers[l]);
        b.gated_ffn(m.hp, l, m.layers[l]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    if (p.hp.recurrent(l)) short_conv(p, L, l);
    else qk_norm_attention(p, L, l);
    swiglu_ffn(p, L);
}

} // namespace

const Arch kLfm2{"lfm2", load_hparams, bind, layer};

} // namespace llmd
