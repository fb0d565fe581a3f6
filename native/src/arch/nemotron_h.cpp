// arch/nemotron_h.cpp — Nemotron-H (Nemotron Nano 9B and 12B v2: nemotron_h) and its
// mixture of experts (Nemotron 3 Nano 30B-A3B: nemotron_h_moe). Every block is one
// sublayer over rmsnorm(x) by attn_norm, added to x, of the kind the layer's metadata
// gives it: a Mamba-2 mixer where it has neither key/value heads nor an FFN width
// (recurrent.h: mamba2), attention without RoPE where it has heads but no FFN width
// (q/k/v and output biases where the file has them), else a feed-forward layer:
// down(relu(up(x))²), with biases where the file has them; or, in nemotron_h_moe, experts
// of that unit (the sigmoid of the router's scores, the top expert_used_count chosen by
// that plus exp_probs_b, weights renormalised and scaled as the file says) and a shared
// one. Nemotron 3 Super's latent experts (moe_latent_size) are refused by name, and a
// file's prediction blocks (nextn_predict_layers) as tensors the family does not use.
#include "arch/arch.h"

namespace llmd {
namespace {

void load_hparams(Binder &b, HParams &hp) {
    const std::string &p = b.prefix;
    b.mamba2_hparams(hp); // layers without key/value heads are Mamba-2 layers...
    std::vector<int> ffs;
    b.per_layer_int(p + "feed_forward_length", hp.n_layer, 0, true, &ffs, false);
    for (int l = 0; l < hp.n_layer; ++l)
        if (ffs[l] > 0) hp.state[l] = 0; // ...unless they have an FFN
    b.mlp_layers = true;
    hp.rope_dim = 0; // no pair turns
    // llama.cpp requires layer_norm_epsilon (its prediction head's) and takes it for the
    // RMS norms where layer_norm_rms_epsilon is absent.
    if (b.file.find(p + "attention.layer_norm_epsilon") == nullptr) {
        b.fail("model metadata lacks " + p + "attention.layer_norm_epsilon");
        return;
    }
    if (b.file.find(p + "attention.layer_norm_rms_epsilon") == nullptr)
        hp.norm_eps = b.get_float(p + "attention.layer_norm_epsilon", 0.0f);
    if (b.get_int(p + "moe_latent_size", 0, false) > 0) {
        b.fail("Nemotron 3 Super's latent experts (" + p + "moe_latent_size) are not supported yet");
        return;
    }
    if (b.get_int(p + "expert_count", 0, false) == 0) return;
    b.expert_widths_per_layer = true;
    b.moe_hparams(hp);
    b.moe_weighting(hp, false);
    hp.gating = HParams::Gating::sigmoid; // as llama.cpp's graph fixes it for the family
    hp.n_ff_shexp = b.get_int(p + "expert_shared_feed_forward_length", 0, true);
    if (b.error->empty() && hp.n_ff_shexp < 1)
        b.fail("model metadata " + p + "expert_shared_feed_forward_length must be positive");
}

void bind(Binder &b, Model &m) {
    const HParams &hp = m.hp;
    const int dim = hp.n_embd;
    std::vector<int> ffs;
    b.per_layer_int(b.prefix + "feed_forward_length", hp.n_layer, 0, true, &ffs, false);
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        LayerWeights &L = m.layers[l];
        if (ffs[l] == 0) { // attn_norm, then the Mamba-2 block's weights or attention's
            b.mamba2_mixer(hp, l, L);
            continue;
        }
        L.attn_norm = b.vector(blk + "attn_norm.weight", dim);
        if (hp.n_expert == 0) {
            b.matrix(blk + "ffn_up.weight", dim, ffs[l], &L.w_up);
            b.matrix(blk + "ffn_down.weight", ffs[l], dim, &L.w_down);
            L.b_up = b.vector(blk + "ffn_up.bias", ffs[l], false);
            L.b_down = b.vector(blk + "ffn_down.bias", dim, false);
            continue;
        }
        b.matrix(blk + "ffn_gate_inp.weight", dim, hp.n_expert, &L.router);
        L.expert_bias = b.vector(blk + "exp_probs_b.bias", hp.n_expert);
        b.experts(blk + "ffn_up_exps.weight", dim, hp.n_ff_exp, hp.n_expert, &L.up_exps);
        b.experts(blk + "ffn_down_exps.weight", hp.n_ff_exp, dim, hp.n_expert, &L.down_exps);
        b.matrix(blk + "ffn_up_shexp.weight", dim, hp.n_ff_shexp, &L.up_shexp);
        b.matrix(blk + "ffn_down_shexp.weight", hp.n_ff_shexp, dim, &L.down_shexp);
    }
}

void layer(const Pass &p, const LayerWeights &L, int l) {
    const HParams &hp = p.hp;
    if (hp.recurrent(l)) {
        rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
        mamba2(p, L, l, p.xb); // xb = the Mamba-2 block's output
        add_rows(p, p.x, p.xb);
    } else if (L.wq.data != nullptr) {
        project_qkv(p, L); // q, k, v of rmsnorm(x), no RoPE
        attend(p, l);      // att = softmax(q kᵀ / √hd) v
        matmuls(p, p.att, {residual(L.wo, p.x, L.bo)});
    } else if (L.router.data != nullptr) {
        rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
        moe(p, L, p.xb, p.x); // x += Σ weight · relu(xb upᵀ)² downᵀ + the shared expert's alike
    } else {
        rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
        MatJob up = project(L.w_up, p.hb, L.b_up), down = residual(L.w_down, p.x, L.b_down);
        up.scale_bias = down.scale_bias = true; // biases inside the scales, as llama.cpp's FFN adds them
        matmuls(p, p.xb, {up});
        relu_squared(p.hb, static_cast<size_t>(p.n) * L.w_up.rows);
        matmuls(p, p.hb, {down}); // x += relu(xb upᵀ)² downᵀ
    }
}

} // namespace

const Arch kNemotronH{"nemotron_h", load_hparams, bind, layer};
const Arch kNemotronHMoe{"nemotron_h_moe", load_hparams, bind, layer};

} // namespace llmd
