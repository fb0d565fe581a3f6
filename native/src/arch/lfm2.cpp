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
    std::vector<int> kv_heads;
    b.per_layer_int(b.prefix + "attention.head_count_kv", hp.n_layer, hp.n_head, false, &kv_heads);
    hp.conv_len = b.get_int(b.prefix + "shortconv.l_cache", 0, true);
    const int window = b.get_int(b.prefix + "attention.sliding_window", 0, false);
    if (!b.error->empty()) return;
    if (hp.conv_len < 2 || hp.conv_len > 64) {
        b.fail("model metadata " + b.prefix + "shortconv.l_cache = " + std::to_string(hp.conv_len) +
               " is out of range (2..64)");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l) {
        if (kv_heads[l] == 0) hp.state[l] = (hp.conv_len - 1) * hp.n_embd; // the last inputs of each channel
        else hp.window[l] = window;
    }
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    if (m.output_norm != nullptr) {
        b.fail("model has tensor output_norm.weight, but lfm2 keeps its final norm in token_embd_norm.weight");
        return;
    }
    m.output_norm = b.vector("token_embd_norm.weight", dim);
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        if (hp.recurrent(l)) {
            L.attn_norm = b.vector(blk + "attn_norm.weight", dim);
            b.matrix(blk + "shortconv.in_proj.weight", dim, 3 * dim, &L.conv_in);
            L.conv_w = b.filters(blk + "shortconv.conv.weight", hp.conv_len, dim);
            b.matrix(blk + "shortconv.out_proj.weight", dim, dim, &L.conv_out);
        } else {
            b.attention(hp, l, L);
            L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim);
            L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim);
        }
        b.gated_ffn(hp, l, L);
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
