// load.cpp — see model.h: a model from a GGUF file. The shared metadata and the
// binder (model.h: Binder) every architecture's binding uses, RoPE scaling, the
// check that no tensor of the file goes unused, and the repacking of the matrices
// into the panels of the kernels this build has.
#include "model/model.h"

#include "arch/arch.h"
#include "kernels/kernels.h"
#include "ops/recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>

namespace llmd {

namespace {

// The widest a layer's heads may be together (q_dim, kv_dim, a recurrent mixer's inner
// size) and a matrix's input, ten times any model's: hyperparameters multiply as ints, and
// no product of them may wrap around (a wrapped one could match the tensors and size
// nothing right), and the workspace is sized by them (a 48 MB file of a 2^22-wide FFN
// asked 11 GiB for one chunk).
constexpr int64_t kMaxWidth = 1 << 18;

// Magnitudes no model's metadata or factors reach: past them a product of a few of them
// over- or underflows a float, and every logit comes out NaN.
bool within_float_range(double v) { return std::fabs(v) >= 1e-30 && std::fabs(v) <= 1e12; }

// RoPE's scaling factors and the magnitudes made of them: real files' are within tens of
// 1; far past them their products under- or overflow a float (a factor of 1e-38, or an
// attn_factor of 3e38, made every logit NaN).
bool within_rope_range(float f) { return f >= 1.0f / 1024 && f <= 1024.0f; }

// Whether tensor t has shape ne, as ggml counts dimensions: trailing dimensions of 1
// may be left out of the file (a [n, 1] matrix is written as [n]).
bool shaped(const GGUFTensor *t, std::initializer_list<int64_t> ne) {
    if (t->n_dims > static_cast<int>(ne.size())) return false;
    int i = 0;
    for (const int64_t n : ne)
        if (t->ne[i++] != n) return false;
    return true;
}

} // namespace

Binder::Binder(const GGUFFile &file, std::string *error, const std::string &arch_name)
    : file(file), error(error), prefix(arch_name + "."), used(file.tensors().size(), false) {}

bool Binder::fail(const std::string &msg) {
    if (error->empty()) *error = msg;
    return false;
}

int Binder::get_int(const std::string &key, int fallback, bool required) {
    int64_t v = fallback;
    std::string err;
    if (!file.get_int(key, &v, &err)) {
        if (!err.empty()) fail(err);
        else if (required) fail("model metadata lacks " + key);
        return fallback;
    }
    if (v < 0 || v > (1 << 30)) {
        fail("model metadata " + key + " = " + std::to_string(v) + " is out of range");
        return fallback;
    }
    return static_cast<int>(v);
}

int Binder::per_layer_int(const std::string &key, int n_layer, int fallback, bool required, std::vector<int> *values,
                          bool must_agree) {
    const GGUFKV *kv = file.find(key);
    if (kv == nullptr || kv->type != GGUF_ARRAY) {
        const int v = get_int(key, fallback, required);
        values->assign(n_layer, v);
        return v;
    }
    if ((kv->arr_type != GGUF_I32 && kv->arr_type != GGUF_U32) || !covers_layers(kv->arr_count, n_layer)) {
        fail("model metadata " + key + " must be one integer per layer");
        return fallback;
    }
    values->resize(n_layer);
    int most = 0;
    for (int l = 0; l < n_layer; ++l) {
        int32_t v;
        std::memcpy(&v, kv->arr_data + 4 * l, 4);
        if (v < 0 || v > (1 << 20)) {
            fail("model metadata " + key + " holds " + std::to_string(v) + ", out of range");
            return fallback;
        }
        (*values)[l] = v;
        most = std::max(most, v);
    }
    return must_agree && !agree(key, *values) ? fallback : most;
}

bool Binder::agree(const std::string &key, const std::vector<int> &values) {
    // Layers that have any have the same number: the shared ops assume it.
    int some = 0;
    for (const int v : values) {
        if (v != 0 && some != 0 && v != some)
            return fail("model metadata " + key + " gives layers different values, which llmd does not run");
        if (v != 0) some = v;
    }
    return true;
}

bool Binder::layer_flags(const std::string &key, int n_layer, std::vector<bool> *flags) {
    const GGUFKV *kv = file.find(key);
    if (kv == nullptr || kv->type != GGUF_ARRAY) return false;
    const size_t width = kv->arr_type == GGUF_BOOL ? 1 : kv->arr_type == GGUF_I32 || kv->arr_type == GGUF_U32 ? 4 : 0;
    if (width == 0 || !covers_layers(kv->arr_count, n_layer))
        return fail("model metadata " + key + " must be one bool, int32 or uint32 per layer");
    flags->assign(n_layer, false);
    for (int l = 0; l < n_layer; ++l) {
        uint32_t v = 0;
        std::memcpy(&v, kv->arr_data + width * l, width); // little-endian, as GGUF is
        (*flags)[l] = v != 0;
    }
    return true;
}

bool Binder::covers_layers(uint64_t count, int n_layer) const {
    return count == static_cast<uint64_t>(n_layer) || count == static_cast<uint64_t>(n_layer) + n_layer_nextn;
}

std::vector<bool> Binder::swa_layers(int n_layer, int period, bool dense_first) {
    const std::string key = prefix + "attention.sliding_window_pattern";
    std::vector<bool> local;
    if (layer_flags(key, n_layer, &local) || !error->empty()) return local;
    period = get_int(key, period, false);
    local.resize(n_layer);
    for (int l = 0; l < n_layer; ++l)
        local[l] = period == 0 || (dense_first ? l % period != 0 : l % period < period - 1);
    return local;
}

void Binder::swa_rope(HParams &hp, float fallback, HParams::LocalRope how) {
    const std::string key = prefix + "rope.freq_base_swa";
    hp.rope_base_local = get_float(key, fallback);
    hp.rope_local = how;
    if (!(hp.rope_base_local > 0.0f) || !std::isfinite(hp.rope_base_local))
        fail("model metadata " + key + " must be positive");
}

float Binder::get_float(const std::string &key, float fallback) {
    double v = fallback;
    std::string err;
    if (!file.get_float(key, &v, &err) && !err.empty()) fail(err);
    else if (v != 0.0 && !within_float_range(v)) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", v);
        fail("model metadata " + key + " = " + text + " is out of range");
    }
    return static_cast<float>(v);
}

const GGUFTensor *Binder::find(const std::string &name, bool required) {
    const GGUFTensor *t = file.tensor(name);
    if (t == nullptr && required) fail("model lacks tensor " + name);
    if (t != nullptr) used[t - file.tensors().data()] = true;
    return t;
}

namespace {

// The weights whose products llama.cpp multiplies by a per-tensor scale from the file
// (its generic pass over every architecture's layers); a scale of any other tensor is
// one it does not know, and stays unbound.
bool scaled_weight(const std::string &name) {
    static const char *const kScaled[] = {
        "attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "attn_gate", "ffn_gate", "ffn_up", "ffn_down",
        "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
        "ssm_in", "ssm_out", "ssm_alpha", "ssm_beta", "nextn.eh_proj", "nextn.shared_head_head"};
    if (name.rfind("blk.", 0) != 0) return false;
    const size_t dot = name.find('.', 4); // after the block number
    if (dot == std::string::npos) return false;
    const std::string part = name.substr(dot + 1);
    for (const char *w : kScaled)
        if (part == std::string(w) + ".weight") return true;
    return false;
}

} // namespace

bool Binder::scales(const std::string &name, int64_t n, float *out) {
    if (!scaled_weight(name)) return false;
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    const auto scale_vector = [&](const std::string &key) -> const float * {
        const GGUFTensor *t = find(key, false);
        if (t == nullptr) return nullptr;
        if (t->type != GGML_F32 || t->n_dims != 1 || t->ne[0] != n) {
            fail("tensor " + key + " should be F32 of " + std::to_string(n) + " elements");
            return nullptr;
        }
        return reinterpret_cast<const float *>(t->data);
    };
    if (scale_vector(base + ".input_scale") != nullptr) unapplied.push_back(base + ".input_scale");
    const float *s = scale_vector(base + ".scale");
    if (s == nullptr) return false;
    if (!ffn_scales && name.find(".ffn_") != std::string::npos) {
        unapplied.push_back(base + ".scale");
        return false;
    }
    std::memcpy(out, s, n * sizeof(float));
    for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(out[i])) return fail("tensor " + base + ".scale holds a value that is not finite");
    return true;
}

bool Binder::matrix(const std::string &name, int64_t cols, int64_t rows, Matrix *m, bool required) {
    const GGUFTensor *t = find(name, required);
    if (t == nullptr) return false;
    if (cols > kMaxWidth)
        return fail("tensor " + name + " is " + std::to_string(cols) + " wide, past " + std::to_string(kMaxWidth));
    if (!shaped(t, {cols, rows}))
        return fail("tensor " + name + " has shape [" + std::to_string(t->ne[0]) + ", " +
                    std::to_string(t->ne[1]) + "], expected [" + std::to_string(cols) + ", " +
                    std::to_string(rows) + "]");
    if (!type_runs(t->type, cols))
        return fail("tensor " + name + " has rows of " + std::to_string(cols) + " elements, which " +
                    type_name(t->type) + " kernels cannot run");
    m->type = t->type;
    m->cols = cols;
    m->rows = rows;
    m->row_bytes = row_bytes(t->type, cols);
    m->data = t->data;
    widest_input = std::max(widest_input, cols);
    scales(name, 1, &m->scale);
    return error->empty();
}

bool Binder::experts(const std::string &name, int64_t cols, int64_t rows, int n, std::vector<Matrix> *out) {
    const GGUFTensor *t = find(name, true);
    if (t == nullptr) return false;
    if (cols > kMaxWidth)
        return fail("tensor " + name + " is " + std::to_string(cols) + " wide, past " + std::to_string(kMaxWidth));
    if (!shaped(t, {cols, rows, n}))
        return fail("tensor " + name + " has shape [" + std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) +
                    ", " + std::to_string(t->ne[2]) + "], expected [" + std::to_string(cols) + ", " +
                    std::to_string(rows) + ", " + std::to_string(n) + "]");
    if (!type_runs(t->type, cols))
        return fail("tensor " + name + " has rows of " + std::to_string(cols) + " elements, which " +
                    type_name(t->type) + " kernels cannot run");
    out->assign(n, Matrix{});
    widest_input = std::max(widest_input, cols);
    std::vector<float> scale(n, 1.0f);
    scales(name, n, scale.data());
    for (int e = 0; e < n; ++e) {
        Matrix &m = (*out)[e];
        m.type = t->type;
        m.cols = cols;
        m.rows = rows;
        m.row_bytes = row_bytes(t->type, cols);
        m.data = t->data + static_cast<size_t>(e) * rows * m.row_bytes;
        m.scale = scale[e];
    }
    return error->empty();
}

bool Binder::split_matrix(const std::string &name, int64_t cols,
                          std::initializer_list<std::pair<Matrix *, int64_t>> parts) {
    int64_t rows = 0;
    for (const auto &part : parts) rows += part.second;
    Matrix fused;
    if (!matrix(name, cols, rows, &fused)) return false;
    int64_t r0 = 0;
    for (const auto &[m, n] : parts) {
        *m = fused;
        m->rows = n;
        m->data = fused.data + static_cast<size_t>(r0) * fused.row_bytes;
        r0 += n;
    }
    return true;
}

const float *Binder::vector(const std::string &name, int64_t n, bool required) {
    const GGUFTensor *t = find(name, required);
    if (t == nullptr) return nullptr;
    if (t->type != GGML_F32 || t->n_dims != 1 || t->ne[0] != n) {
        fail("tensor " + name + " should be F32 of " + std::to_string(n) + " elements");
        return nullptr;
    }
    if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
        fail("tensor " + name + " is misaligned");
        return nullptr;
    }
    return reinterpret_cast<const float *>(t->data);
}

void Binder::unapplied_vector(const std::string &name, int64_t n) {
    if (vector(name, n, false) != nullptr) unapplied.push_back(name);
}

const float *Binder::filters(const std::string &name, int64_t cols, int64_t rows) {
    const GGUFTensor *t = find(name, true);
    if (t == nullptr) return nullptr;
    if (t->type != GGML_F32 || !shaped(t, {cols, rows})) {
        fail("tensor " + name + " should be F32 of shape [" + std::to_string(cols) + ", " + std::to_string(rows) + "]");
        return nullptr;
    }
    if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
        fail("tensor " + name + " is misaligned");
        return nullptr;
    }
    return reinterpret_cast<const float *>(t->data);
}

void Binder::attention(const HParams &hp, int l, LayerWeights &L) {
    L.attn_norm = vector("blk." + std::to_string(l) + ".attn_norm.weight", hp.n_embd);
    attention_weights(hp, l, L);
}

void Binder::attention_weights(const HParams &hp, int l, LayerWeights &L, int64_t q_rows) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const int dim = hp.n_embd;
    if (q_rows == 0) q_rows = hp.q_dim();
    if (file.tensor(blk + "attn_qkv.weight") != nullptr) {
        fused_qkv(hp, l, L, q_rows);
    } else {
        matrix(blk + "attn_q.weight", dim, q_rows, &L.wq);
        matrix(blk + "attn_k.weight", dim, hp.kv_dim(), &L.wk);
        matrix(blk + "attn_v.weight", dim, hp.kv_dim(), &L.wv);
        L.bq = vector(blk + "attn_q.bias", q_rows, false);
        L.bk = vector(blk + "attn_k.bias", hp.kv_dim(), false);
        L.bv = vector(blk + "attn_v.bias", hp.kv_dim(), false);
    }
    matrix(blk + "attn_output.weight", hp.q_dim(), dim, &L.wo);
}

void Binder::fused_qkv(const HParams &hp, int l, LayerWeights &L, int64_t q_rows) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    split_matrix(blk + "attn_qkv.weight", hp.n_embd, {{&L.wq, q_rows}, {&L.wk, hp.kv_dim()}, {&L.wv, hp.kv_dim()}});
    if (const float *b = vector(blk + "attn_qkv.bias", q_rows + 2 * hp.kv_dim(), false)) {
        L.bq = b;
        L.bk = b + q_rows;
        L.bv = b + q_rows + hp.kv_dim();
        return;
    }
    L.bq = vector(blk + "attn_q.bias", q_rows, false);
    L.bk = vector(blk + "attn_k.bias", hp.kv_dim(), false);
    L.bv = vector(blk + "attn_v.bias", hp.kv_dim(), false);
    if (L.bq != nullptr && L.bk != nullptr && L.bv != nullptr) return;
    for (const char *bias : {"attn_q.bias", "attn_k.bias", "attn_v.bias"})
        if (file.tensor(blk + bias) != nullptr) unapplied.push_back(blk + bias);
    L.bq = L.bk = L.bv = nullptr;
}

void Binder::gated_ffn(const HParams &hp, int l, LayerWeights &L, const char *norm) {
    L.ffn_norm = vector("blk." + std::to_string(l) + "." + norm + ".weight", hp.n_embd);
    ffn_weights(hp, l, L);
}

void Binder::ffn_weights(const HParams &hp, int l, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    matrix(blk + "ffn_gate.weight", hp.n_embd, hp.n_ff, &L.w_gate);
    matrix(blk + "ffn_up.weight", hp.n_embd, hp.n_ff, &L.w_up);
    matrix(blk + "ffn_down.weight", hp.n_ff, hp.n_embd, &L.w_down);
}

void Binder::ffn_biases(const HParams &hp, int l, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    L.b_gate = vector(blk + "ffn_gate.bias", hp.n_ff, false);
    L.b_up = vector(blk + "ffn_up.bias", hp.n_ff, false);
    L.b_down = vector(blk + "ffn_down.bias", hp.n_embd, false);
}

void Binder::post_norm_block(const HParams &hp, int l, LayerWeights &L, int64_t q_norm, int64_t k_norm) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    attention_weights(hp, l, L);
    L.q_norm = vector(blk + "attn_q_norm.weight", q_norm);
    L.k_norm = vector(blk + "attn_k_norm.weight", k_norm);
    L.attn_post_norm = vector(blk + "post_attention_norm.weight", hp.n_embd);
    ffn_weights(hp, l, L);
    L.ffn_post_norm = vector(blk + "post_ffw_norm.weight", hp.n_embd);
}

void Binder::moe_hparams(HParams &hp) {
    hp.n_expert = get_int(prefix + "expert_count", 0, true);
    hp.n_expert_used = get_int(prefix + "expert_used_count", 0, true);
    if (hp.n_expert < 1 || hp.n_expert > 4096 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert) {
        fail("model expert counts are inconsistent (" + std::to_string(hp.n_expert_used) + " of " +
             std::to_string(hp.n_expert) + ")");
        return;
    }
    // A width of 0, as llama.cpp's writer puts it for "unset", takes the default as absence does.
    const std::string width = prefix + "expert_feed_forward_length";
    std::vector<int> widths;
    hp.n_ff_exp = expert_widths_per_layer ? per_layer_int(width, hp.n_layer, 0, false, &widths) : get_int(width, 0, false);
    if (hp.n_ff_exp == 0) hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
    if (hp.n_ff_exp < 1) fail("model expert FFN length is invalid");
    // A shared expert is as wide as the file says, else as the dense FFN would be.
    if (file.tensor("blk.0.ffn_up_shexp.weight") != nullptr) {
        hp.n_ff_shexp = get_int(prefix + "expert_shared_feed_forward_length", 0, false);
        if (hp.n_ff_shexp == 0) hp.n_ff_shexp = hp.n_ff;
    }
}

void Binder::moe_weighting(HParams &hp, bool norm) {
    std::string err;
    if (!file.get_bool(prefix + "expert_weights_norm", &norm, &err) && !err.empty()) fail(err);
    hp.expert_norm = norm;
    const float scale = get_float(prefix + "expert_weights_scale", 0.0f);
    hp.expert_scale = scale == 0.0f ? 1.0f : scale; // 0, as files write "none", scales by 1
    if (!std::isfinite(hp.expert_scale)) fail("model expert weight scale is invalid");
}

void Binder::moe_gating(HParams &hp, bool required) {
    const std::string key = prefix + "expert_gating_func";
    const int func = get_int(key, 0, required);
    if (!error->empty()) return;
    static const HParams::Gating kGatings[] = {HParams::Gating::softmax, HParams::Gating::sigmoid,
                                               HParams::Gating::softmax_chosen, HParams::Gating::sqrt_softplus};
    if (func < 1 || func > 4) {
        fail("model metadata " + key + " = " + std::to_string(func) +
             " is a gating llmd does not run (1: softmax, 2: sigmoid, 3: softmax of the chosen, 4: sqrt of softplus)");
        return;
    }
    hp.gating = kGatings[func - 1];
}

void Binder::moe_ffn(const HParams &hp, int l, LayerWeights &L, const char *norm) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const int dim = hp.n_embd;
    L.ffn_norm = vector(blk + norm + ".weight", dim);
    matrix(blk + "ffn_gate_inp.weight", dim, hp.n_expert, &L.router);
    if (file.tensor(blk + "ffn_gate_up_exps.weight") != nullptr) {
        // gate and up fused, as llama.cpp's writer may store them: in each expert's
        // slice the gate's rows, then the up projection's.
        std::vector<Matrix> fused;
        experts(blk + "ffn_gate_up_exps.weight", dim, 2 * static_cast<int64_t>(hp.n_ff_exp), hp.n_expert, &fused);
        L.gate_exps = L.up_exps = fused;
        for (size_t e = 0; e < fused.size(); ++e) {
            L.gate_exps[e].rows = L.up_exps[e].rows = hp.n_ff_exp;
            L.up_exps[e].data += static_cast<size_t>(hp.n_ff_exp) * fused[e].row_bytes;
        }
    } else {
        experts(blk + "ffn_gate_exps.weight", dim, hp.n_ff_exp, hp.n_expert, &L.gate_exps);
        experts(blk + "ffn_up_exps.weight", dim, hp.n_ff_exp, hp.n_expert, &L.up_exps);
    }
    experts(blk + "ffn_down_exps.weight", hp.n_ff_exp, dim, hp.n_expert, &L.down_exps);
    if (hp.n_ff_shexp == 0) return;
    if (shexp_gated) L.shexp_gate = vector(blk + "ffn_gate_inp_shexp.weight", dim);
    matrix(blk + "ffn_gate_shexp.weight", dim, hp.n_ff_shexp, &L.gate_shexp);
    matrix(blk + "ffn_up_shexp.weight", dim, hp.n_ff_shexp, &L.up_shexp);
    matrix(blk + "ffn_down_shexp.weight", hp.n_ff_shexp, dim, &L.down_shexp);
}

namespace {

// Which layers are DeltaNet layers, as llama.cpp reads it: a flag per layer, one flag
// for every layer, or else every layer but each full_attention_interval-th.
bool read_recurrent_layers(Binder &b, const HParams &hp, std::vector<bool> *recurrent) {
    const std::string key = b.prefix + "attention.recurrent_layers";
    if (b.layer_flags(key, hp.n_layer, recurrent)) return true;
    if (!b.error->empty()) return false;
    if (b.file.find(key) != nullptr) {
        recurrent->assign(hp.n_layer, b.get_int(key, 0, true) != 0);
        return b.error->empty();
    }
    recurrent->assign(hp.n_layer, false);
    const int interval = b.get_int(b.prefix + "full_attention_interval", 4, false);
    if (interval < 1) return b.fail("model metadata " + b.prefix + "full_attention_interval must be positive");
    for (int l = 0; l < hp.n_layer; ++l) (*recurrent)[l] = (l + 1) % interval != 0;
    return true;
}

} // namespace

bool Binder::rope_sections(HParams &hp, bool interleaved, int sections[4]) {
    const std::string key = prefix + "rope.dimension_sections";
    const GGUFKV *kv = file.find(key);
    if (kv == nullptr) return fail("model metadata lacks " + key);
    if (kv->type != GGUF_ARRAY || (kv->arr_type != GGUF_I32 && kv->arr_type != GGUF_U32) || kv->arr_count < 3 ||
        kv->arr_count > 4)
        return fail("model metadata " + key + " must be 3 or 4 integers");
    int total = 0;
    std::fill_n(sections, 4, 0);
    for (uint64_t i = 0; i < kv->arr_count; ++i) {
        int32_t v;
        std::memcpy(&v, kv->arr_data + 4 * i, 4);
        if (v < 0 || v > hp.rope_dim) return fail("model metadata " + key + " holds an out-of-range section");
        sections[i] = v;
        total += v;
    }
    if (total == 0 || total > hp.head_dim) return fail("model metadata " + key + " does not fit the heads");
    hp.rope_fixed.assign(hp.rope_dim / 2, false);
    const int text = sections[0] + sections[1] + sections[2];
    for (int i = 0; i < hp.rope_dim / 2; ++i) {
        const int sector = i % total;
        hp.rope_fixed[i] = interleaved ? sector >= 3 * sections[sector % 3] : sector >= text;
    }
    return true;
}

void Binder::delta_net_hparams(HParams &hp) {
    HParams::DeltaNet &dn = hp.delta;
    hp.conv_len = get_int(prefix + "ssm.conv_kernel", 0, true);
    const int inner = get_int(prefix + "ssm.inner_size", 0, true);
    dn.head_dim = get_int(prefix + "ssm.state_size", 0, true);
    dn.v_heads = get_int(prefix + "ssm.time_step_rank", 0, true);
    dn.k_heads = get_int(prefix + "ssm.group_count", 0, true);
    if (!error->empty()) return;
    if (hp.conv_len < 2 || hp.conv_len > 64 || dn.head_dim < 1 || dn.head_dim > 1024 || dn.v_heads < 1 ||
        dn.k_heads < 1 || dn.v_heads % dn.k_heads != 0 || inner > kMaxWidth ||
        inner != static_cast<int64_t>(dn.v_heads) * dn.head_dim) {
        fail("model Gated DeltaNet dimensions (ssm.*) are inconsistent");
        return;
    }
    std::vector<bool> recurrent;
    int sections[4];
    if (!read_recurrent_layers(*this, hp, &recurrent) || !rope_sections(hp, true, sections)) return;
    const int state = (hp.conv_len - 1) * dn.conv_dim() + dn.v_heads * dn.head_dim * dn.head_dim;
    for (int l = 0; l < hp.n_layer; ++l) hp.state[l] = recurrent[l] ? state : 0;
}

void Binder::delta_net_mixer(const HParams &hp, int l, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const HParams::DeltaNet &dn = hp.delta;
    const int dim = hp.n_embd;
    L.attn_norm = vector(blk + "attn_norm.weight", dim);
    if (l < hp.n_layer && hp.recurrent(l)) {
        matrix(blk + "attn_qkv.weight", dim, dn.conv_dim(), &L.delta_in);
        matrix(blk + "attn_gate.weight", dim, dn.v_dim(), &L.delta_gate);
        L.conv_w = filters(blk + "ssm_conv1d.weight", hp.conv_len, dn.conv_dim());
        L.delta_dt = vector(blk + "ssm_dt.bias", dn.v_heads);
        L.delta_a = vector(blk + "ssm_a", dn.v_heads);
        matrix(blk + "ssm_beta.weight", dim, dn.v_heads, &L.delta_beta);
        matrix(blk + "ssm_alpha.weight", dim, dn.v_heads, &L.delta_alpha);
        L.delta_norm = vector(blk + "ssm_norm.weight", dn.head_dim);
        matrix(blk + "ssm_out.weight", dn.v_dim(), dim, &L.delta_out);
    } else { // an attention layer, or a prediction block (always one)
        attention_weights(hp, l, L, 2 * hp.q_dim()); // per head: queries, then the gate; optional biases
        L.q_norm = vector(blk + "attn_q_norm.weight", hp.head_dim);
        L.k_norm = vector(blk + "attn_k_norm.weight", hp.head_dim);
    }
}

void Binder::short_conv_hparams(HParams &hp) {
    std::vector<int> kv_heads;
    per_layer_int(prefix + "attention.head_count_kv", hp.n_layer, hp.n_head, false, &kv_heads);
    hp.conv_len = get_int(prefix + "shortconv.l_cache", 0, true);
    if (!error->empty()) return;
    if (hp.conv_len < 2 || hp.conv_len > 64) {
        fail("model metadata " + prefix + "shortconv.l_cache = " + std::to_string(hp.conv_len) + " is out of range (2..64)");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l)
        if (kv_heads[l] == 0) hp.state[l] = (hp.conv_len - 1) * hp.n_embd; // the last inputs of each channel
}

void Binder::short_conv_mixer(const HParams &hp, int l, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const int dim = hp.n_embd;
    if (hp.recurrent(l)) {
        L.attn_norm = vector(blk + "attn_norm.weight", dim);
        matrix(blk + "shortconv.in_proj.weight", dim, 3 * dim, &L.conv_in);
        L.conv_w = filters(blk + "shortconv.conv.weight", hp.conv_len, dim);
        matrix(blk + "shortconv.out_proj.weight", dim, dim, &L.conv_out);
    } else {
        attention(hp, l, L);
        L.q_norm = vector(blk + "attn_q_norm.weight", hp.head_dim);
        L.k_norm = vector(blk + "attn_k_norm.weight", hp.head_dim);
    }
}

void Binder::short_conv_output_norm(Model &m) {
    if (m.output_norm != nullptr) {
        fail("model has tensor output_norm.weight, but " + prefix.substr(0, prefix.size() - 1) +
             " keeps its final norm in token_embd_norm.weight");
        return;
    }
    m.output_norm = vector("token_embd_norm.weight", m.hp.n_embd);
}

void Binder::mamba2_hparams(HParams &hp) {
    HParams::Mamba2 &mb = hp.mamba;
    std::vector<int> kv_heads;
    per_layer_int(prefix + "attention.head_count_kv", hp.n_layer, hp.n_head, false, &kv_heads);
    hp.conv_len = get_int(prefix + "ssm.conv_kernel", 0, true);
    const int inner = get_int(prefix + "ssm.inner_size", 0, true);
    mb.d_state = get_int(prefix + "ssm.state_size", 0, true);
    mb.heads = get_int(prefix + "ssm.time_step_rank", 0, true);
    mb.groups = get_int(prefix + "ssm.group_count", 0, true);
    if (!error->empty()) return;
    if (hp.conv_len < 2 || hp.conv_len > 64 || mb.d_state < 1 || mb.d_state > 1024 || mb.heads < 1 ||
        inner > kMaxWidth || inner % mb.heads != 0 || inner / mb.heads > 1024 || mb.groups < 1 ||
        mb.heads % mb.groups != 0) {
        fail("model Mamba-2 dimensions (ssm.*) are inconsistent");
        return;
    }
    mb.head_dim = inner / mb.heads;
    const int64_t state = static_cast<int64_t>(hp.conv_len - 1) * mb.conv_dim() +
                          static_cast<int64_t>(mb.heads) * mb.head_dim * mb.d_state;
    if (state > (1 << 28)) { // 1 GB of floats a layer: no file llama.cpp writes
        fail("model Mamba-2 state of " + std::to_string(state) + " floats a layer is out of range");
        return;
    }
    for (int l = 0; l < hp.n_layer; ++l)
        if (kv_heads[l] == 0) hp.state[l] = static_cast<int>(state);
}

void Binder::mamba2_mixer(const HParams &hp, int l, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const HParams::Mamba2 &mb = hp.mamba;
    const int dim = hp.n_embd;
    L.attn_norm = vector(blk + "attn_norm.weight", dim);
    if (hp.recurrent(l)) {
        matrix(blk + "ssm_in.weight", dim, mb.inner() + mb.conv_dim() + mb.heads, &L.ssm_in);
        L.conv_w = filters(blk + "ssm_conv1d.weight", hp.conv_len, mb.conv_dim());
        L.conv_b = vector(blk + "ssm_conv1d.bias", mb.conv_dim(), false);
        L.ssm_dt = vector(blk + "ssm_dt.bias", mb.heads);
        L.ssm_a = filters(blk + "ssm_a", 1, mb.heads);
        L.ssm_d = filters(blk + "ssm_d", 1, mb.heads);
        L.ssm_norm = filters(blk + "ssm_norm.weight", mb.inner() / mb.groups, mb.groups);
        matrix(blk + "ssm_out.weight", mb.inner(), dim, &L.ssm_out);
    } else {
        attention_weights(hp, l, L); // with optional q/k/v biases
        L.bo = vector(blk + "attn_output.bias", dim, false);
    }
}

void Binder::nextn(const HParams &hp, int l, NextNWeights &N) {
    const std::string blk = "blk." + std::to_string(l) + ".nextn.";
    const int dim = hp.n_embd;
    matrix(blk + "eh_proj.weight", 2 * dim, dim, &N.eh_proj);
    N.enorm = vector(blk + "enorm.weight", dim);
    N.hnorm = vector(blk + "hnorm.weight", dim);
    matrix(blk + "embed_tokens.weight", dim, hp.n_vocab, &N.embed_tokens, false);
    matrix(blk + "shared_head_head.weight", dim, hp.n_vocab, &N.head, false);
    N.head_norm = vector(blk + "shared_head_norm.weight", dim, false);
}

namespace {

const Arch *const kArchs[] = {&kLlama, &kCohere2, &kErnie45, &kErnie45Moe, &kExaone4, &kGemma, &kGemma2, &kGemma3,
                              &kGemma4, &kGlm4, &kGlm4Moe, &kGptOss, &kGranite, &kGraniteMoe, &kGraniteHybrid,
                              &kLfm2, &kLfm2Moe, &kMistral3, &kNemotronH, &kNemotronHMoe, &kOlmo2, &kPhi3, &kQwen2,
                              &kQwen2Moe, &kQwen3, &kQwen35, &kQwen35Moe, &kQwen3Moe, &kSmallThinker, &kSmolLM3};

// How a file scales RoPE beyond its training context, read as llama.cpp reads it: a
// factor without a type is linear; YaRN blends interpolated and extrapolated
// frequencies pair by pair and corrects the magnitude.
struct RopeScaling {
    enum Kind { none, linear, yarn } kind = none;
    float factor = 1.0f;      // context extension: interpolated frequencies are divided by it
    float attn_factor = 1.0f; // multiplies cos and sin
    int n_ctx_orig = 0;       // YaRN: the context the model was trained at
};

bool read_rope_scaling(Binder &b, const HParams &hp, RopeScaling *rs) {
    const std::string &p = b.prefix;
    std::string err;
    std::string_view type = "linear";
    if (!b.file.get_string(p + "rope.scaling.type", &type, &err) && !err.empty()) return b.fail(err);
    float factor = b.get_float(p + "rope.scaling.factor", 0.0f);
    if (factor == 0.0f) factor = b.get_float(p + "rope.scale_linear", 0.0f); // the older key
    rs->attn_factor = b.get_float(p + "rope.scaling.attn_factor", 1.0f);
    rs->n_ctx_orig = b.get_int(p + "rope.scaling.original_context_length", hp.n_ctx_train, false);
    if (!b.error->empty()) return false;
    if (factor == 0.0f) factor = 1.0f;
    if (!within_rope_range(factor) || !within_rope_range(rs->attn_factor) || rs->n_ctx_orig < 1)
        return b.fail("model RoPE scaling factor is invalid");
    rs->factor = factor; // kept with type none: the window layers of some families still take it (rope_frequencies)
    if (type == "none") {
        rs->kind = RopeScaling::none;
    } else if (type == "linear") {
        rs->kind = factor == 1.0f ? RopeScaling::none : RopeScaling::linear;
    } else if (type == "longrope") { // its factors are tensors (rope_frequencies); a factor here is linear
        rs->kind = factor == 1.0f ? RopeScaling::none : RopeScaling::linear;
    } else if (type == "yarn") {
        rs->kind = RopeScaling::yarn;
    } else {
        return b.fail("unsupported RoPE scaling '" + std::string(type) + "' (llmd runs none, linear, yarn, longrope)");
    }
    return true;
}

// out (dims / 2): each pair's frequency from `base`, divided by the factors of
// tensor `factors` when the file has it (Llama 3.1's rope_freqs, Phi-3's LongRoPE sets;
// none when empty), then scaled as rs says.
bool rope_table(Binder &b, const RopeScaling &rs, const HParams &hp, int dims, double base,
                const std::string &factors, std::vector<float> *out) {
    const int half = dims / 2;
    const GGUFTensor *freqs = factors.empty() ? nullptr : b.find(factors, false);
    if (freqs != nullptr && (freqs->type != GGML_F32 || freqs->n_dims != 1 || freqs->ne[0] != half))
        return b.fail("tensor " + factors + " has the wrong type or shape");
    // YaRN keeps the pairs that turn many times over the original context (below
    // `low`) extrapolated, interpolates those that turn less than once (above
    // `high`), and ramps between; beta_fast 32 and beta_slow 1 unless the family reads others.
    const auto corr_dim = [&](double turns) {
        return dims * std::log(rs.n_ctx_orig / (turns * 2 * M_PI)) / (2 * std::log(base));
    };
    const double low = std::max(0.0, std::floor(corr_dim(hp.yarn_beta_fast))),
                 high = std::min(dims - 1.0, std::ceil(corr_dim(hp.yarn_beta_slow)));
    out->resize(half);
    for (int i = 0; i < half; ++i) {
        double f = std::pow(base, -2.0 * i / dims);
        if (freqs != nullptr) {
            float div;
            std::memcpy(&div, freqs->data + 4 * i, 4);
            // llama.cpp divides by any factor; zero or one not finite has no angle, and one
            // near zero would make angles overflow. A huge one leaves its pair all but
            // unturned (Gemma 4's 1e30 for the dims its global layers do not turn).
            if (!(std::fabs(div) >= 1e-30f) || !std::isfinite(div))
                return b.fail("tensor " + factors + " holds a factor out of range");
            f /= div;
        }
        if (!hp.rope_fixed.empty() && hp.rope_fixed[i]) f = 0.0; // an angle of 0 at every position
        if (rs.kind == RopeScaling::linear) f /= rs.factor;
        if (rs.kind == RopeScaling::yarn) {
            const double extrapolated = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
            f *= (1.0 - extrapolated) / rs.factor + extrapolated;
        }
        (*out)[i] = static_cast<float>(f);
    }
    return true;
}

// m.inv_freq (and m.inv_freq_long for LongRoPE files), and m.inv_freq_local for
// sliding-window layers that turn by angles of their own (HParams::rope_local).
bool rope_frequencies(Binder &b, const RopeScaling &rs, Model &m) {
    HParams &hp = m.hp;
    // Scaled window layers take the trained factor whatever the type: with type none,
    // llama.cpp leaves the global layers unscaled but divides theirs by the factor
    // (freq_scale_swa is the trained scale), linearly.
    RopeScaling local{};
    if (hp.rope_local == HParams::LocalRope::scaled) {
        local = rs;
        if (rs.kind == RopeScaling::none) local.kind = RopeScaling::linear;
    }
    const int local_dims = hp.rope_dim_local > 0 ? hp.rope_dim_local : hp.rope_dim;
    if (hp.rope_base_local > 0.0f && !rope_table(b, local, hp, local_dims, hp.rope_base_local, "", &m.inv_freq_local))
        return false;
    const bool longrope = b.file.tensor("rope_factors_short.weight") != nullptr ||
                          b.file.tensor("rope_factors_long.weight") != nullptr;
    if (longrope && b.file.tensor("rope_freqs.weight") != nullptr)
        return b.fail("model has both rope_freqs and LongRoPE factors");
    if (!longrope) return rope_table(b, rs, hp, hp.rope_dim, hp.rope_base, "rope_freqs.weight", &m.inv_freq);
    // LongRoPE (Phi-3): short factors up to the original context, long ones past it.
    if (!rope_table(b, rs, hp, hp.rope_dim, hp.rope_base, "rope_factors_short.weight", &m.inv_freq) ||
        !rope_table(b, rs, hp, hp.rope_dim, hp.rope_base, "rope_factors_long.weight", &m.inv_freq_long))
        return false;
    m.rope_ctx_orig = rs.n_ctx_orig;
    return true;
}

// hp.rope_mscale and hp.rope_mscale_local, as ggml's RoPE computes them: the context's
// magnitude factor (rope.scaling.attn_factor; with YaRN also (1 + 0.1 ln f) / (1 + 0.1 ·
// log_mul · ln f) over (1 + 0.1 ln f)), times (1 + 0.1 ln f) where YaRN turns a layer
// with its frequencies scaled by 1 / f. False (failed) for one outside the factors' range.
bool rope_magnitudes(Binder &b, const RopeScaling &rs, HParams &hp) {
    float context = rs.attn_factor;
    hp.rope_mscale = rs.attn_factor;
    if (rs.kind == RopeScaling::yarn && rs.factor > 1.0f) {
        const float ln = std::log(rs.factor), log_mul = hp.yarn_log_mul != 0.0f ? 1.0f + 0.1f * hp.yarn_log_mul * ln : 1.0f;
        context /= log_mul;
        hp.rope_mscale *= (1.0f + 0.1f * ln) / log_mul;
    }
    switch (hp.rope_local) {
    case HParams::LocalRope::scaled: hp.rope_mscale_local = hp.rope_mscale; break;
    case HParams::LocalRope::unscaled: hp.rope_mscale_local = context; break;
    case HParams::LocalRope::plain: hp.rope_mscale_local = 1.0f; break;
    }
    if (!within_rope_range(hp.rope_mscale) || !within_rope_range(hp.rope_mscale_local))
        return b.fail("model RoPE magnitude (attn_factor, yarn_log_multiplier) is out of range");
    return true;
}

} // namespace

const Arch *find_arch(std::string_view name) {
    for (const Arch *a : kArchs)
        if (name == a->name) return a;
    return nullptr;
}

std::string arch_names() {
    std::string names;
    for (const Arch *a : kArchs) names += (names.empty() ? "" : ", ") + std::string(a->name);
    return names;
}

std::string unsupported_tensors(const GGUFFile &file) {
    std::vector<std::pair<uint32_t, std::vector<std::string_view>>> by_type; // in order of first use
    for (const auto &t : file.tensors()) {
        if (type_traits(t.type)->activation != Activation::None) continue;
        auto it = std::find_if(by_type.begin(), by_type.end(), [&](const auto &e) { return e.first == t.type; });
        if (it == by_type.end()) it = by_type.insert(by_type.end(), {t.type, {}});
        it->second.push_back(t.name);
    }
    std::string out;
    for (const auto &[type, names] : by_type) {
        out += (out.empty() ? "" : ", ") + std::string(type_name(type)) + " (" + std::string(names[0]);
        if (names.size() > 1) out += " and " + std::to_string(names.size() - 1) + " more";
        out += ")";
    }
    return out.empty() ? out : "the engine has no kernels for tensor type " + out;
}

std::unique_ptr<Model> Model::load(const GGUFFile &file, const Arch &arch, int n_vocab, std::string *error) {
    auto model = std::make_unique<Model>();
    model->arch = &arch;
    Binder b(file, error, arch.name);
    HParams &hp = model->hp;
    const std::string &p = b.prefix;
    hp.n_vocab = n_vocab;
    hp.n_ctx_train = b.get_int(p + "context_length", 0, true);
    hp.n_embd = b.get_int(p + "embedding_length", 0, true);
    const int n_blocks = b.get_int(p + "block_count", 0, true);
    // Every layer has a norm and a matrix at least: refuse an absurd block count
    // before allocating for it.
    if (static_cast<uint64_t>(n_blocks) * 2 > file.tensors().size()) {
        *error = p + "block_count = " + std::to_string(n_blocks) + " but the file holds only " +
                 std::to_string(file.tensors().size()) + " tensors";
        return nullptr;
    }
    // The multi-token-prediction blocks, if any, are the last of block_count. A family
    // that has none leaves their tensors unbound, and the file is refused by name.
    hp.n_layer_nextn = b.n_layer_nextn = b.get_int(p + "nextn_predict_layers", 0, false);
    hp.n_layer = n_blocks - hp.n_layer_nextn;
    if (!error->empty()) return nullptr;
    if (n_blocks < 1) {
        *error = p + "block_count = " + std::to_string(n_blocks) + ": the model has no layers";
        return nullptr;
    }
    if (hp.n_layer < 1) {
        *error = p + "nextn_predict_layers = " + std::to_string(hp.n_layer_nextn) + " leaves no layer of the " +
                 std::to_string(n_blocks) + " blocks to run";
        return nullptr;
    }
    // Per layer: hybrid models give 0 to their recurrent layers; where layers differ
    // otherwise, only a family with layer_shapes runs them (checked after its metadata).
    std::vector<int> heads, kv_heads, ffs;
    hp.n_head = b.per_layer_int(p + "attention.head_count", hp.n_layer, 0, true, &heads);
    hp.n_head_kv = b.per_layer_int(p + "attention.head_count_kv", hp.n_layer, hp.n_head, false, &kv_heads, false);
    hp.n_ff = b.per_layer_int(p + "feed_forward_length", hp.n_layer, 0, true, &ffs, false);
    hp.rope_base = b.get_float(p + "rope.freq_base", 10000.0f);
    hp.norm_eps = b.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5f);
    if (!error->empty()) return nullptr;
    if (hp.n_ctx_train < 1 || hp.n_embd < 1 || hp.n_layer < 1 || hp.n_head < 1 || hp.n_ff < 1 ||
        hp.n_head_kv < 1 || hp.n_head % hp.n_head_kv != 0) {
        *error = "model hyperparameters are inconsistent (heads, dims or layers)";
        return nullptr;
    }
    // Heads are n_embd / n_head wide unless the file says otherwise (Qwen3, Gemma 3).
    hp.head_dim = b.get_int(p + "attention.key_length", 0, false);
    if (hp.head_dim == 0 && hp.n_embd % hp.n_head != 0) {
        *error = "model hyperparameters are inconsistent (heads, dims or layers)";
        return nullptr;
    }
    if (hp.head_dim == 0) hp.head_dim = hp.n_embd / hp.n_head;
    hp.rope_dim = b.get_int(p + "rope.dimension_count", hp.head_dim, false);
    if (hp.head_dim < 2 || hp.head_dim > 1024 || hp.rope_dim > hp.head_dim || hp.rope_dim % 2 != 0 ||
        b.get_int(p + "attention.value_length", hp.head_dim, false) != hp.head_dim) {
        *error = "model head or RoPE dimensions are inconsistent";
        return nullptr;
    }
    if (static_cast<int64_t>(hp.n_head) * hp.head_dim > kMaxWidth) {
        *error = "model " + p + "attention.head_count = " + std::to_string(hp.n_head) + " of " +
                 std::to_string(hp.head_dim) + " dimensions is wider than " + std::to_string(kMaxWidth);
        return nullptr;
    }
    if (!(hp.rope_base > 0.0f) || !std::isfinite(hp.rope_base)) {
        *error = "model RoPE base is invalid";
        return nullptr;
    }
    RopeScaling scaling;
    if (!read_rope_scaling(b, hp, &scaling)) return nullptr;
    hp.window.assign(n_blocks, 0);
    hp.state.assign(n_blocks, 0);
    hp.layer_head_dim.assign(n_blocks, hp.head_dim);
    hp.layer_kv_heads.assign(n_blocks, hp.n_head_kv);
    std::copy(kv_heads.begin(), kv_heads.end(), hp.layer_kv_heads.begin());
    hp.kv_from.resize(n_blocks);
    for (int l = 0; l < n_blocks; ++l) hp.kv_from[l] = l;
    arch.load_hparams(b, hp);
    if (!b.layer_shapes) {
        b.agree(p + "attention.head_count_kv", kv_heads);
        b.agree(p + "feed_forward_length", ffs);
    }
    if (!error->empty()) return nullptr;
    // (after the family's metadata: a LayerNorm family reads its own epsilon)
    if (!(hp.norm_eps > 0.0f && hp.norm_eps <= 1.0f)) {
        *error = "model norm epsilon is invalid";
        return nullptr;
    }
    for (int l = 0; l < hp.n_layer; ++l) {
        // A layer without heads computes nothing unless the family gives it a recurrent
        // state or makes it a feed-forward layer.
        if ((heads[l] == 0 || kv_heads[l] == 0) && !hp.recurrent(l) && !b.mlp_layers) {
            *error = "layer " + std::to_string(l) + " has no attention heads, and the " + arch.name +
                     " architecture gives it no recurrent state";
            return nullptr;
        }
    }

    const int dim = hp.n_embd;
    if (!b.matrix("token_embd.weight", dim, n_vocab, &model->tok_embd)) return nullptr;
    model->output_norm = b.vector("output_norm.weight", dim, false); // or the family's own name, in bind
    if (file.tensor("output.weight") != nullptr) {
        if (!b.matrix("output.weight", dim, n_vocab, &model->output)) return nullptr;
    } else {
        model->output = model->tok_embd;
    }
    model->layers.resize(hp.n_layer);
    model->nextn.resize(hp.n_layer_nextn);
    arch.bind(b, *model);
    if (!error->empty()) return nullptr;
    // feed_forward_length sizes the dense FFN's buffers: where every block routes to experts
    // no tensor checks it, and it sizes nothing (2^30 made 8 GiB of buffers).
    const auto dense = [](const LayerWeights &L) { return L.w_down.data != nullptr; };
    if (std::none_of(model->layers.begin(), model->layers.end(), dense) &&
        std::none_of(model->nextn.begin(), model->nextn.end(), [&](const NextNWeights &n) { return dense(n.block); }))
        hp.n_ff = 0;
    hp.matrix_input = static_cast<int>(b.widest_input); // at most kMaxWidth
    if (model->output_norm == nullptr) {
        *error = "model lacks tensor output_norm.weight";
        return nullptr;
    }

    if (!rope_frequencies(b, scaling, *model)) return nullptr;
    if (!rope_magnitudes(b, scaling, hp)) return nullptr;

    // A tensor nobody bound is a part of the model llmd would not compute.
    for (size_t i = 0; i < b.used.size(); ++i)
        if (!b.used[i]) {
            *error = "model has tensor " + std::string(file.tensors()[i].name) + ", which the " + arch.name +
                     " architecture does not use";
            return nullptr;
        }
    if (!b.unapplied.empty())
        b.warnings.push_back("tensor " + b.unapplied[0] +
                             (b.unapplied.size() > 1 ? " and " + std::to_string(b.unapplied.size() - 1) + " more" : "") +
                             " (which llama.cpp loads and does not apply for " + arch.name + " either) are not used by llmd");
    model->warnings = std::move(b.warnings);
    for (const auto &t : file.tensors()) model->weight_bytes += t.size;
    model->pack();
    return model;
}

void Model::use_context(int n_ctx) {
    if (!inv_freq_long.empty() && n_ctx > rope_ctx_orig) inv_freq = inv_freq_long;
}

AlignedBytes::AlignedBytes(size_t n, bool huge) {
    const size_t align = huge ? size_t{2} << 20 : 64, size = (std::max<size_t>(n, 1) + align - 1) / align * align;
    void *p = nullptr;
    if (posix_memalign(&p, align, size) != 0) throw std::bad_alloc();
    raw.reset(static_cast<uint8_t *>(p));
    data = raw.get();
    // A decode step streams every weight: with 4 KB pages that is a TLB miss every
    // 4 KB. Where the kernel grants huge pages only on request, this requests them.
    if (huge) madvise(p, size, MADV_HUGEPAGE);
}

namespace {

// Gives the mapped pages of a packed original back to the page cache: the engine
// reads the packed copy from now on (a tied embedding's rows fault back in singly).
void release_mapping(const Matrix &m) {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(m.data) + page - 1) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(m.data) + m.rows * m.row_bytes) & ~(page - 1);
    if (end > begin) madvise(reinterpret_cast<void *>(begin), end - begin, MADV_DONTNEED);
}

} // namespace

void Model::pack() {
    std::vector<Matrix *> matrices{&output};
    if (ple_model_proj.data != nullptr) matrices.push_back(&ple_model_proj);
    const auto add_block = [&](LayerWeights &L) {
        for (Matrix *m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.router, &L.gate_shexp,
                          &L.up_shexp, &L.down_shexp, &L.conv_in, &L.conv_out, &L.delta_in, &L.delta_gate,
                          &L.delta_beta, &L.delta_alpha, &L.delta_out, &L.ssm_in, &L.ssm_out, &L.ple_gate,
                          &L.ple_proj})
            if (m->data != nullptr) matrices.push_back(m);
        for (std::vector<Matrix> *stack : {&L.gate_exps, &L.up_exps, &L.down_exps})
            for (Matrix &m : *stack) matrices.push_back(&m);
    };
    for (LayerWeights &L : layers) add_block(L);
    for (NextNWeights &N : nextn) {
        add_block(N.block);
        for (Matrix *m : {&N.eh_proj, &N.head})
            if (m->data != nullptr) matrices.push_back(m);
    }
    const auto span = [](const Matrix *m) { return (packed_bytes(m->type, m->rows, m->cols) + 63) / 64 * 64; };
    size_t total = 0;
    for (const Matrix *m : matrices) total += span(m);
    if (total == 0) return;
    packed = std::make_unique<AlignedBytes>(total, true); // one block: few huge pages
    uint8_t *at = packed->data;
    for (Matrix *m : matrices) {
        const size_t n = packed_bytes(m->type, m->rows, m->cols);
        if (n == 0) continue;
        pack_rows(m->type, m->data, m->rows, m->cols, at);
        m->packed = at;
        at += span(m);
        weight_bytes += n - m->rows * m->row_bytes;
        release_mapping(*m);
    }
}

} // namespace llmd
