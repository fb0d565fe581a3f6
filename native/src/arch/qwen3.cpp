// arch/qwen3.cpp — Qwen3 (dense): the Llama block with an RMS norm over each query
// and key head before NEOX RoPE. Heads may be wider than n_embd / n_head
// (attention.key_length); q/k/v biases are optional. A reranker's classifier head
// (cls.output) scores its rank pooling.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &, HParams &) {} // only the keys every decoder has

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    // Qwen3 reranker files add a classifier head over the final hidden state, one row
    // per label of classifier.output_labels (one when the file names none): the output
    // head's "yes" and "no" rows, whose softmax is the score.
    const GGUFKV *labels = b.file.find(b.prefix + "classifier.output_labels");
    const bool named = labels != nullptr && labels->type == GGUF_ARRAY && labels->arr_count > 0;
    m.classifier.softmax = b.matrix("cls.output.weight", hp.n_embd,
                                    named ? static_cast<int64_t>(labels->arr_count) : 1, &m.classifier.out, false);
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
    qk_norm_attention(p, L, l);
    swiglu_ffn(p, L);
}

} // namespace

const Arch kQwen3{"qwen3", load_hparams, bind, layer};

} // namespace llmd
