// arch/qwen35.cpp — Qwen3.5 (dense): Gated DeltaNet layers (recurrent.h:
// gated_delta_net) interleaved with gated full-attention layers, by default three
// DeltaNet layers then one attention layer (full_attention_interval, or one bool per
// layer in attention.recurrent_layers). An attention layer's query projection gives each
// head its queries and, beside them, a gate: the attention output is multiplied by
// sigmoid(gate) before the output projection; queries and keys are RMS-normed per head,
// and RoPE turns the first rope.dimension_count dims of each head (NEOX pairs) by the
// multi-section scheme, which for text positions rotates the pairs of the first three
// sections and leaves the fourth's unrotated. Every layer then has the SwiGLU
// feed-forward, normed by post_attention_norm.
#include "arch/arch.h"

#include <cmath>
#include <cstring>

namespace llmd {
namespace {

// Which layers are DeltaNet layers, as llama.cpp reads it.
bool read_recurrent_layers(Binder &b, const HParams &hp, std::vector<bool> *recurrent) {
    const std::string key = b.prefix + "attention.recurrent_layers";
    if (b.layer_flags(key, hp.n_layer, recurrent)) return true;
    if (b.file.find(key) != nullptr) // a scalar (a bad array has failed already)
        return b.fail("model metadata " + key + " must be one bool or integer per layer");
    recurrent->assign(hp.n_layer, false);
    const int interval = b.get_int(b.prefix + "full_attention_interval", 4, false);
    if (interval < 1) return b.fail("model metadata " + b.prefix + "full_attention_interval must be positive");
    for (int l = 0; l < hp.n_layer; ++l) (*recurrent)[l] = (l + 1) % interval != 0;
    return true;
}

// The multi-section RoPE of text positions: pair i lies in section i % Σsections,
// interleaved (sector s belongs to section s % 3 while s < 3 · that section's size);
// the sectors of none of the first three sections take the fourth position, which is
// 0 for text, so they stay unrotated.
bool read_rope_sections(Binder &b, HParams &hp) {
    const std::string key = b.prefix + "rope.dimension_sections";
    const GGUFKV *kv = b.file.find(key);
    if (kv == nullptr) return b.fail("model metadata lacks " + key);
    if (kv->type != GGUF_ARRAY || (kv->arr_type != GGUF_I32 && kv->arr_type != GGUF_U32) || kv->arr_count < 3 ||
        kv->arr_count > 4)
        return b.fail("model metadata " + key + " must be 3 or 4 integers");
    int sections[4] = {0, 0, 0, 0}, total = 0;
    for (uint64_t i = 0; i < kv->arr_count; ++i) {
        int32_t v;
        std::memcpy(&v, kv->arr_data + 4 * i, 4);
        if (v < 0 || v > hp.rope_dim) return b.fail("model metadata " + key + " holds an out-of-range section");
        sections[i] = v;
        total += v;
    }
    if (total == 0 || total > hp.head_dim) return b.fail("model metadata " + key + " does not fit the heads");
    hp.rope_fixed.assign(hp.rope_dim / 2, false);
    for (int i = 0; i < hp.rope_dim / 2; ++i) {
        const int sector = i % total;
        const bool text = sector < 3 * sections[sector % 3];
        hp.rope_fixed[i] = !text;
    }
    return true;
}

void load_hparams(Binder &b, HParams &hp) {
    HParams::DeltaNet &dn = hp.delta;
    hp.conv_len = b.get_int(b.prefix + "ssm.conv_kernel", 0, true);
    const int inner = b.get_int(b.prefix + "ssm.inner_size", 0, true);
    dn.head_dim = b.get_int(b.prefix + "ssm.state_size", 0, true);
    dn.v_heads = b.get_int(b.prefix + "ssm.time_step_rank", 0, true);
    dn.k_heads = b.get_int(b.prefix + "ssm.group_count", 0, true);
    if (!b.error->empty()) return;
    if (hp.conv_len < 2 || hp.conv_len > 64 || dn.head_dim < 1 || dn.head_dim > 1024 || dn.v_heads < 1 ||
        dn.k_heads < 1 || dn.v_heads % dn.k_heads != 0 || inner != dn.v_heads * dn.head_dim) {
        b.fail("model Gated DeltaNet dimensions (ssm.*) are inconsistent");
        return;
    }
    std::vector<bool> recurrent;
    if (!read_recurrent_layers(b, hp, &recurrent) || !read_rope_sections(b, hp)) return;
    const int state = (hp.conv_len - 1) * dn.conv_dim() + dn.v_heads * dn.head_dim * dn.head_dim;
    for (int l = 0; l < hp.n_layer; ++l) hp.state[l] = recurrent[l] ? state : 0;
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const HParams::DeltaNet &dn = hp.delta;
    const int dim = hp.n_embd;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        L.attn_norm = b.vector(blk + "attn_norm.weight", dim);
        if (hp.recurrent(l)) {
            b.matrix(blk + "attn_qkv.weight", dim, dn.conv_dim(), &L.delta_in);
            b.matrix(blk + "attn_gate.weight", dim, dn.v_dim(), &L.delta_gate);
            L.conv_w = b.filters(blk + "ssm_conv1d.weight", hp.conv_len, dn.conv_dim());
            L.delta_dt = b.vector(blk + "ssm_dt.bias", dn.v_heads);
            L.delta_a = b.vector(blk + "ssm_a", dn.v_heads);
            b.matrix(blk + "ssm_beta.weight", dim, dn.v_heads, &L.delta_beta);
            b.matrix(blk + "ssm_alpha.weight", dim, dn.v_heads, &L.delta_alpha);
            L.delta_norm = b.vector(blk + "ssm_norm.weight", dn.head_dim);
            b.matrix(blk + "ssm_out.weight", dn.v_dim(), dim, &L.delta_out);
        } else {
            b.matrix(blk + "attn_q.weight", dim, 2 * hp.q_dim(), &L.wq); // per head: queries, then the gate
            b.matrix(blk + "attn_k.weight", dim, hp.kv_dim(), &L.wk);
            b.matrix(blk + "attn_v.weight", dim, hp.kv_dim(), &L.wv);
            b.matrix(blk + "attn_output.weight", hp.q_dim(), dim, &L.wo);
            L.q_norm = b.vector(blk + "attn_q_norm.weight", hp.head_dim);
            L.k_norm = b.vector(blk + "attn_k_norm.weight", hp.head_dim);
        }
        b.gated_ffn(hp, l, L, "post_attention_norm"); // the FFN's norm, by Qwen3.5's name
    }
}

// Attention whose output each head gates by sigmoid of its own projection.
void gated_attention(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    const int hd = hp.head_dim, q_dim = hp.q_dim();
    std::vector<float> &qg = p.ws.recurrent; // (n, 2 · q_dim): per head, queries then gate
    qg.resize(static_cast<size_t>(p.n) * 2 * q_dim);
    rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
    matmuls(p, p.xb, {project(L.wq, qg.data()), project(L.wk, p.k), project(L.wv, p.v)});
    for (int t = 0; t < p.n; ++t)
        for (int h = 0; h < hp.n_head; ++h)
            std::memcpy(p.q + static_cast<size_t>(t) * q_dim + h * hd, qg.data() + (static_cast<size_t>(t) * hp.n_head + h) * 2 * hd,
                        hd * sizeof(float));
    rmsnorm_heads(p, p.q, hp.n_head, L.q_norm);
    rmsnorm_heads(p, p.k, hp.n_head_kv, L.k_norm);
    rope(p, p.q, hp.n_head, Rope::neox);
    rope(p, p.k, hp.n_head_kv, Rope::neox);
    attend(p, l); // att = softmax(q kᵀ / √hd) v
    for (int t = 0; t < p.n; ++t)
        for (int h = 0; h < hp.n_head; ++h) {
            float *a = p.att + static_cast<size_t>(t) * q_dim + h * hd;
            const float *gate = qg.data() + (static_cast<size_t>(t) * hp.n_head + h) * 2 * hd + hd;
            for (int i = 0; i < hd; ++i) a[i] /= 1.0f + std::exp(-gate[i]);
        }
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += gated att · woᵀ
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    if (p.hp.recurrent(l)) gated_delta_net(p, L, l);
    else gated_attention(p, L, l);
    swiglu_ffn(p, L);
}

} // namespace

const Arch kQwen35{"qwen35", load_hparams, bind, layer};

} // namespace llmd
