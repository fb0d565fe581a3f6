// arch/qwen35.cpp — Qwen3.5 (dense): Gated DeltaNet layers (recurrent.h:
// gated_delta_net) interleaved with gated full-attention layers, by default three
// DeltaNet layers then one attention layer (full_attention_interval, or a flag per
// layer in attention.recurrent_layers: Binder::delta_net_hparams). An attention layer's query projection gives each
// head its queries and, beside them, a gate: the attention output is multiplied by
// sigmoid(gate) before the output projection; queries and keys are RMS-normed per head,
// and RoPE turns the first rope.dimension_count dims of each head (NEOX pairs) by the
// multi-section scheme, which for text positions rotates the pairs of the first three
// sections and leaves the fourth's unrotated (model.h: gated_attention). Every layer
// then has the SwiGLU feed-forward, normed by post_attention_norm. Multi-token-prediction
// blocks (nextn_predict_layers): the first drafts (model.h: forward_nextn).
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) { b.delta_net_hparams(hp); }

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) {
        b.delta_net_mixer(hp, l, m.layers[l]);
        b.gated_ffn(hp, l, m.layers[l], "post_attention_norm"); // the FFN's norm, by Qwen3.5's name
    }
    for (int i = 0; i < hp.n_layer_nextn; ++i) { // prediction blocks: gated attention and the FFN
        NextNWeights &N = m.nextn[i];
        b.delta_net_mixer(hp, hp.n_layer + i, N.block);
        b.gated_ffn(hp, hp.n_layer + i, N.block, "post_attention_norm");
        b.nextn(hp, hp.n_layer + i, N);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    if (p.hp.recurrent(l)) gated_delta_net(p, L, l);
    else gated_attention(p, L, l);
    swiglu_ffn(p, L);
}

} // namespace

const Arch kQwen35{"qwen35", load_hparams, bind, layer};

} // namespace llmd
