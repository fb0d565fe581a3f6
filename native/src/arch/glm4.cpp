// arch/glm4.cpp — GLM-4 (GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1): each sublayer's input
// and output RMS-normed, as Gemma's are (model.h: sandwich_norm_rest); q/k/v biases;
// RoPE over the first rope.dimension_count dims of each head in adjacent pairs; a
// SwiGLU FFN whose gate and up projections are one ffn_up of 2 × ff rows (gate first).
// A file with rope.dimension_sections (GLM-4.1V's text model) turns instead by the
// multi-section RoPE of text positions, in NEOX halves, as llama.cpp does when its
// first two sections are not empty. Multi-token-prediction blocks (nextn_predict_layers)
// are loaded into Model::nextn, not run, as llama.cpp leaves them.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    b.ffn_scales = false; // llama.cpp's graph of this family leaves its FFN weights' scales out
    if (b.file.find(b.prefix + "rope.dimension_sections") == nullptr) return;
    int sections[4];
    if (b.rope_sections(hp, false, sections) && (sections[0] == 0 || sections[1] == 0))
        hp.rope_fixed.clear(); // plain RoPE, as llama.cpp turns such a file
}

void bind_block(Binder &b, const HParams &hp, int l, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const int dim = hp.n_embd;
    b.attention(hp, l, L); // q/k/v, or one attn_qkv, with their biases
    L.attn_post_norm = b.vector(blk + "post_attention_norm.weight", dim);
    L.ffn_norm = b.vector(blk + "ffn_norm.weight", dim);
    b.split_matrix(blk + "ffn_up.weight", dim, {{&L.w_gate, hp.n_ff}, {&L.w_up, hp.n_ff}});
    b.matrix(blk + "ffn_down.weight", hp.n_ff, dim, &L.w_down);
    L.ffn_post_norm = b.vector(blk + "post_ffw_norm.weight", dim);
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    for (int l = 0; l < hp.n_layer; ++l) bind_block(b, hp, l, m.layers[l]);
    for (int i = 0; i < hp.n_layer_nextn; ++i) {
        bind_block(b, hp, hp.n_layer + i, m.nextn[i].block);
        b.nextn(hp, hp.n_layer + i, m.nextn[i]);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    const Rope style = hp.rope_fixed.empty() ? Rope::adjacent : Rope::neox;
    project_qkv(p, L); // of rmsnorm(x) by attn_norm
    rope(p, p.q, hp.n_head, style);
    rope(p, p.k, hp.n_head_kv, style);
    sandwich_norm_rest(p, l, L, Glu::silu); // attention, its norm, residual; the FFN, its norm, residual
}

} // namespace

const Arch kGlm4{"glm4", load_hparams, bind, layer};

} // namespace llmd
