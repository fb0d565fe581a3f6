// arch/qwen3.cpp — Qwen3 (dense): the Llama block with an RMS norm over each query
// and key head before NEOX RoPE. Heads may be wider than n_embd / n_head
// (attention.key_length); q/k/v biases are optional.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &, HParams &) {} // only the keys every decoder has

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        b.attention(hp, l, L);
        L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim);
        L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim);
        b.gated_ffn(hp, l, L);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    project_qkv(p, L); // q, k, v of rmsnorm(x)
    rmsnorm_heads(p, p.q, p.hp.n_head, L.q_norm); // each head to unit RMS, then scaled
    rmsnorm_heads(p, p.k, p.hp.n_head_kv, L.k_norm);
    rope(p, p.q, p.hp.n_head, Rope::neox);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox);
    attend(p, l);                             // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += att woᵀ
    swiglu_ffn(p, L);
}

} // namespace

const Arch kQwen3{"qwen3", load_hparams, bind, layer};

} // namespace llmd
