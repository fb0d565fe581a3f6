// arch/gemma4.cpp — Gemma 4 (text; E2B, E4B, 26B-A4B, 31B): Gemma 3's block (embeddings scaled
// by √n_embd, attention and FFN each normed before and after, NEOX RoPE, a GELU-gated
// FFN, local layers over a sliding window), and:
//   - layers of two shapes: the sliding-window ones have heads of key_length_swa, the
//     global ones of key_length, and each layer its own count of key/value heads and FFN
//     width (HParams::layer_head_dim, layer_kv_heads; feed_forward_length per layer);
//   - every query, key and value head RMS-normed (values without a weight), scores
//     unscaled; a global layer without attn_v takes its keys as values, before their norm;
//   - the global layers turn all of their heads' dims with rope_freqs' factors (which
//     leave most pairs unturned), the local ones rope.dimension_count_swa of them by a
//     base of their own;
//   - the last shared_kv_layers layers write no keys and values: they attend the last
//     earlier layer of their kind's (HParams::kv_from), as llama.cpp maps them;
//   - per-layer inputs (E2B, E4B): for each token and layer, n_embd_per_layer floats of
//     its own embedding (per_layer_token_embd) and of a projection of the input
//     embeddings; after each layer's FFN, x += norm(proj(gelu(gate(x)) * that input));
//   - optionally each layer's output multiplied by layer_output_scale;
//   - final logits soft-capped (final_logit_softcapping, 30 when absent, 0 for none);
//   - in a layer with experts (26B-A4B: expert_count set and the layer's ffn_gate_inp
//     there), the experts beside the dense FFN, each with norms of its own (experts_ffn).
// Gemma 4's norms multiply by their weights as stored.
#include "arch/arch.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>

namespace llmd {
namespace {

constexpr int kMaxHeadDim = 1024; // Model::load's bound on head_dim

void load(Binder &b, HParams &hp) {
    const std::string &p = b.prefix;
    b.layer_shapes = true;
    if (b.get_int(p + "expert_count", 0, false) > 0) {
        b.expert_widths_per_layer = true; // as llama.cpp reads expert_feed_forward_length for the family
        b.moe_hparams(hp);
        hp.expert_glu = Glu::gelu; // a softmax over all experts, the chosen renormalised: llama.cpp's graph fixes both
    }
    std::vector<bool> local;
    if (!b.layer_flags(p + "attention.sliding_window_pattern", hp.n_layer, &local)) {
        if (b.error->empty())
            b.fail("model metadata " + p + "attention.sliding_window_pattern must be one flag per layer");
        return;
    }
    const int window = b.get_int(p + "attention.sliding_window", 0, true);
    const int hd_local = b.get_int(p + "attention.key_length_swa", hp.head_dim, false);
    const int rope_local = b.get_int(p + "rope.dimension_count_swa", hp.rope_dim, false);
    const int shared = b.get_int(p + "attention.shared_kv_layers", 0, false);
    hp.n_embd_per_layer = b.get_int(p + "embedding_length_per_layer_input", 0, true);
    if (!b.error->empty()) return;
    if (window < 1) {
        b.fail("model metadata " + p + "attention.sliding_window must be positive");
        return;
    }
    const int hd_local_v = b.get_int(p + "attention.value_length_swa", hd_local, false);
    if (hd_local < 2 || hd_local > hp.head_dim || hd_local_v != hd_local || rope_local < 2 || rope_local > hd_local ||
        rope_local % 2 != 0) {
        b.fail("model head or RoPE dimensions of the sliding-window layers are inconsistent");
        return;
    }
    if (shared < 0 || shared > hp.n_layer - 2) {
        b.fail("model metadata " + p + "attention.shared_kv_layers = " + std::to_string(shared) +
               " leaves fewer than two layers with keys and values of their own");
        return;
    }
    if (hp.n_embd_per_layer < 0 || hp.n_embd_per_layer > hp.n_ff) {
        b.fail("model metadata " + p + "embedding_length_per_layer_input is out of range");
        return;
    }
    const int first_shared = hp.n_layer - shared;
    for (int l = 0; l < hp.n_layer; ++l) {
        hp.window[l] = local[l] ? window : 0;
        hp.layer_head_dim[l] = local[l] ? hd_local : hp.head_dim;
        if (hp.kv_heads(l) < 1 || hp.n_head % hp.kv_heads(l) != 0) {
            b.fail("layer " + std::to_string(l) + "'s key/value heads do not divide its query heads");
            return;
        }
        // A shared layer reads the last layer of its kind that keeps keys and values.
        if (l >= first_shared) {
            const int from = first_shared - (local[l] ? 2 : 1);
            if (local[from] != local[l] || hp.kv_heads(from) != hp.kv_heads(l)) {
                b.fail("layer " + std::to_string(l) + " shares the keys and values of layer " + std::to_string(from) +
                       ", which has another shape");
                return;
            }
            hp.kv_from[l] = from;
        }
    }
    b.swa_rope(hp, 10000.0f, HParams::LocalRope::unscaled);
    hp.rope_dim_local = rope_local;
    hp.attn_scale = 1.0f; // the queries and keys are normed
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    hp.logit_softcap = b.get_float(p + "final_logit_softcapping", 30.0f);
    if (!(hp.logit_softcap >= 0.0f) || !std::isfinite(hp.logit_softcap))
        b.fail("model metadata " + p + "final_logit_softcapping must not be negative");
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd, n_pl = hp.n_embd_per_layer;
    std::vector<int> ffs;
    b.per_layer_int(b.prefix + "feed_forward_length", hp.n_layer, 0, true, &ffs, false);
    if (n_pl > 0) {
        const int64_t rows = static_cast<int64_t>(hp.n_layer) * n_pl;
        b.matrix("per_layer_token_embd.weight", rows, hp.n_vocab, &m.ple_embd);
        b.matrix("per_layer_model_proj.weight", dim, rows, &m.ple_model_proj);
        m.ple_proj_norm = b.vector("per_layer_proj_norm.weight", n_pl);
    }
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        const int hd = hp.hd(l), q_dim = hp.n_head * hd, kv_dim = hp.kv_heads(l) * hd;
        L.attn_norm = b.vector(blk + "attn_norm.weight", dim);
        b.matrix(blk + "attn_q.weight", dim, q_dim, &L.wq);
        L.q_norm = b.vector(blk + "attn_q_norm.weight", hd);
        if (hp.kv_from[l] == l) {
            b.matrix(blk + "attn_k.weight", dim, kv_dim, &L.wk);
            b.matrix(blk + "attn_v.weight", dim, kv_dim, &L.wv, false);
            L.k_norm = b.vector(blk + "attn_k_norm.weight", hd);
        } else { // a shared layer's own keys and values, where the file keeps them, are never computed
            for (const char *name : {"attn_k.weight", "attn_v.weight"}) {
                Matrix unused;
                if (b.matrix(blk + name, dim, kv_dim, &unused, false) && unused.data != nullptr)
                    b.unapplied.push_back(blk + name);
            }
            if (b.vector(blk + "attn_k_norm.weight", hd, false) != nullptr) b.unapplied.push_back(blk + "attn_k_norm");
        }
        b.matrix(blk + "attn_output.weight", q_dim, dim, &L.wo);
        L.attn_post_norm = b.vector(blk + "post_attention_norm.weight", dim);
        L.ffn_norm = b.vector(blk + "ffn_norm.weight", dim);
        b.matrix(blk + "ffn_gate.weight", dim, ffs[l], &L.w_gate);
        b.matrix(blk + "ffn_up.weight", dim, ffs[l], &L.w_up);
        b.matrix(blk + "ffn_down.weight", ffs[l], dim, &L.w_down);
        L.ffn_post_norm = b.vector(blk + "post_ffw_norm.weight", dim);
        if (hp.n_expert > 0 && b.file.tensor(blk + "ffn_gate_inp.weight") != nullptr) {
            b.moe_ffn(hp, l, L); // the router and the expert stacks (its norm is the dense FFN's, bound above)
            L.route_scale = b.vector(blk + "ffn_gate_inp.scale", dim);
            L.exps_norm = b.vector(blk + "pre_ffw_norm_2.weight", dim);
            L.exps_post_norm = b.vector(blk + "post_ffw_norm_2.weight", dim);
            L.mlp_post_norm = b.vector(blk + "post_ffw_norm_1.weight", dim);
        }
        L.out_scale = b.vector(blk + "layer_output_scale.weight", 1, false);
        if (n_pl > 0) {
            b.matrix(blk + "inp_gate.weight", dim, n_pl, &L.ple_gate);
            b.matrix(blk + "proj.weight", n_pl, dim, &L.ple_proj);
            L.ple_norm = b.vector(blk + "post_norm.weight", dim);
        }
    }
}

// ws.per_layer (n, n_layer · n_pl), from the scaled input embeddings x: per token and
// layer, (rmsnorm(x · ple_model_projᵀ / √n_embd) + its ple_embd row · √n_pl) / √2.
void per_layer_inputs(const Pass &p) {
    const Model &m = p.model;
    const HParams &hp = p.hp;
    const int n_pl = hp.n_embd_per_layer, width = hp.n_layer * n_pl;
    float *out = p.ws.per_layer.data();
    matmuls(p, p.x, {project(m.ple_model_proj, out)});
    const float proj_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd));
    const float embd_scale = std::sqrt(static_cast<float>(n_pl)), input_scale = 1.0f / std::sqrt(2.0f);
    const TypeTraits &embd = *type_traits(m.ple_embd.type);
    std::vector<float> row(width);
    for (int t = 0; t < p.n; ++t) {
        float *y = out + static_cast<size_t>(t) * width;
        embd.to_float(m.ple_embd.row(p.batch[t].token), row.data(), width);
        for (int i = 0; i < width; ++i) y[i] *= proj_scale;
        for (int l = 0; l < hp.n_layer; ++l) rmsnorm(y + l * n_pl, y + l * n_pl, m.ple_proj_norm, n_pl, hp.norm_eps);
        for (int i = 0; i < width; ++i) y[i] = (y[i] + row[i] * embd_scale) * input_scale;
    }
}

// The FFN of a layer with experts, once attention has joined x: the dense FFN over
// rmsnorm(x) by ffn_norm, its output normed by mlp_post_norm, plus the experts over
// rmsnorm(x) by exps_norm, routed by rmsnorm(x) / √dim · route_scale (model.h: moe),
// their weighted sum normed by exps_post_norm; x += rmsnorm(the two's sum) by ffn_post_norm.
void experts_ffn(const Pass &p, const LayerWeights &L) {
    const size_t size = static_cast<size_t>(p.n) * p.hp.n_embd;
    std::vector<float> &route = p.ws.moe_route, &experts = p.ws.sublayer;
    route.resize(size);
    rmsnorm_rows(p, route.data(), p.x, L.route_scale);
    const float unit = 1.0f / std::sqrt(static_cast<float>(p.hp.n_embd));
    for (float &r : route) r *= unit;
    rmsnorm_rows(p, p.xb, p.x, L.exps_norm);
    experts.assign(size, 0.0f);
    moe(p, L, p.xb, experts.data(), route.data()); // experts = Σ weight · geglu expert(xb)
    rmsnorm_rows(p, experts.data(), experts.data(), L.exps_post_norm);

    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    matmuls(p, p.xb, {geglu(L.w_gate, L.w_up, p.hb, p.hb2)}); // hb = gelu(xb gateᵀ) * (xb upᵀ)
    matmuls(p, p.hb, {project(L.w_down, p.xb)});               // xb = hb downᵀ
    rmsnorm_rows(p, p.xb, p.xb, L.mlp_post_norm);
    add_rows(p, p.xb, experts.data());
    rmsnorm_rows(p, p.xb, p.xb, L.ffn_post_norm);
    add_rows(p, p.x, p.xb);
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    static const std::vector<float> ones(kMaxHeadDim, 1.0f); // the values' norm has no weight
    const HParams &hp = p.hp;
    const int hd = hp.hd(l), n_kv = hp.kv_heads(l), n_pl = hp.n_embd_per_layer;
    const bool local = hp.window[l] > 0;
    if (l == 0 && n_pl > 0) per_layer_inputs(p); // x holds the scaled embeddings

    // attention
    rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
    if (hp.kv_from[l] != l) {
        matmuls(p, p.xb, {project(L.wq, p.q)});
    } else {
        if (L.wv.data != nullptr) {
            matmuls(p, p.xb, {project(L.wq, p.q), project(L.wk, p.k), project(L.wv, p.v)});
        } else { // the keys, before their norm, are the values
            matmuls(p, p.xb, {project(L.wq, p.q), project(L.wk, p.k)});
            std::copy_n(p.k, static_cast<size_t>(p.n) * n_kv * hd, p.v);
        }
        rmsnorm_heads(p, p.k, n_kv, L.k_norm, hd);
        rmsnorm_heads(p, p.v, n_kv, ones.data(), hd);
        rope(p, p.k, n_kv, Rope::neox, local, hd);
    }
    rmsnorm_heads(p, p.q, hp.n_head, L.q_norm, hd);
    rope(p, p.q, hp.n_head, Rope::neox, local, hd);
    if (L.router.data != nullptr) { // attention over the layer's (or its source's) cache, then the FFN
        sandwich_attention(p, l, L);
        experts_ffn(p, L);
    } else {
        sandwich_norm_rest(p, l, L);
    }

    // the layer's own input
    if (n_pl > 0) {
        matmuls(p, p.x, {project(L.ple_gate, p.hb)}); // hb (n, n_pl) = x gateᵀ
        const int width = hp.n_layer * n_pl;
        for (int t = 0; t < p.n; ++t) // hb = gelu(hb) * the token's input of this layer
            kernels().glu(true, p.hb + static_cast<size_t>(t) * n_pl,
                          p.ws.per_layer.data() + static_cast<size_t>(t) * width + l * n_pl, n_pl);
        matmuls(p, p.hb, {project(L.ple_proj, p.xb)}); // xb = hb projᵀ
        rmsnorm_rows(p, p.xb, p.xb, L.ple_norm);
        add_rows(p, p.x, p.xb);                        // x += norm(hb projᵀ)
    }
    if (L.out_scale != nullptr) {
        const size_t n = static_cast<size_t>(p.n) * hp.n_embd;
        for (size_t i = 0; i < n; ++i) p.x[i] *= L.out_scale[0];
    }
}

} // namespace

const Arch kGemma4{"gemma4", load, bind, layer};

} // namespace llmd
