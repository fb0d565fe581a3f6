// model.cpp — see model.h: loading (shared metadata, the architecture's binding,
// the unused-tensor check, repacking), the kernels and shared ops layers are built
// from, and the forward pass: embed, each layer as its architecture builds it, then
// the final norm and output head.
#include "model/model.h"

#include "arch/arch.h"
#include "ops/attention.h"
#include "ops/recurrent.h"
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>

namespace llmd {

// ---- loading -----------------------------------------------------------

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

int Binder::per_layer_int(const std::string &key, int n_layer, int fallback, bool required, std::vector<int> *values) {
    const GGUFKV *kv = file.find(key);
    if (kv == nullptr || kv->type != GGUF_ARRAY) {
        const int v = get_int(key, fallback, required);
        values->assign(n_layer, v);
        return v;
    }
    if ((kv->arr_type != GGUF_I32 && kv->arr_type != GGUF_U32) || kv->arr_count != static_cast<uint64_t>(n_layer)) {
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
        // Layers that have heads have the same number: the shared attention assumes it.
        if (v != 0 && most != 0 && v != most) {
            fail("model metadata " + key + " gives layers different head counts, which llmd does not run");
            return fallback;
        }
        (*values)[l] = v;
        most = std::max(most, v);
    }
    return most;
}

bool Binder::layer_flags(const std::string &key, int n_layer, std::vector<bool> *flags) {
    const GGUFKV *kv = file.find(key);
    if (kv == nullptr || kv->type != GGUF_ARRAY) return false;
    size_t width = 0;
    switch (kv->arr_type) {
    case GGUF_BOOL: case GGUF_U8: case GGUF_I8: width = 1; break;
    case GGUF_U16: case GGUF_I16: width = 2; break;
    case GGUF_U32: case GGUF_I32: width = 4; break;
    case GGUF_U64: case GGUF_I64: width = 8; break;
    default: break;
    }
    if (width == 0 || kv->arr_count != static_cast<uint64_t>(n_layer))
        return fail("model metadata " + key + " must be one bool or integer per layer");
    flags->assign(n_layer, false);
    for (int l = 0; l < n_layer; ++l) {
        uint64_t v = 0;
        std::memcpy(&v, kv->arr_data + width * l, width); // little-endian, as GGUF is
        (*flags)[l] = v != 0;
    }
    return true;
}

float Binder::get_float(const std::string &key, float fallback) {
    double v = fallback;
    std::string err;
    if (!file.get_float(key, &v, &err) && !err.empty()) fail(err);
    return static_cast<float>(v);
}

const GGUFTensor *Binder::find(const std::string &name, bool required) {
    const GGUFTensor *t = file.tensor(name);
    if (t == nullptr && required) fail("model lacks tensor " + name);
    if (t != nullptr) used[t - file.tensors().data()] = true;
    return t;
}

bool Binder::matrix(const std::string &name, int64_t cols, int64_t rows, Matrix *m, bool required) {
    const GGUFTensor *t = find(name, required);
    if (t == nullptr) return false;
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
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
    return true;
}

bool Binder::experts(const std::string &name, int64_t cols, int64_t rows, int n, std::vector<Matrix> *out) {
    const GGUFTensor *t = find(name, true);
    if (t == nullptr) return false;
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n)
        return fail("tensor " + name + " has shape [" + std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) +
                    ", " + std::to_string(t->ne[2]) + "], expected [" + std::to_string(cols) + ", " +
                    std::to_string(rows) + ", " + std::to_string(n) + "]");
    if (!type_runs(t->type, cols))
        return fail("tensor " + name + " has rows of " + std::to_string(cols) + " elements, which " +
                    type_name(t->type) + " kernels cannot run");
    out->assign(n, Matrix{});
    for (int e = 0; e < n; ++e) {
        Matrix &m = (*out)[e];
        m.type = t->type;
        m.cols = cols;
        m.rows = rows;
        m.row_bytes = row_bytes(t->type, cols);
        m.data = t->data + static_cast<size_t>(e) * rows * m.row_bytes;
    }
    return true;
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

const float *Binder::filters(const std::string &name, int64_t cols, int64_t rows) {
    const GGUFTensor *t = find(name, true);
    if (t == nullptr) return nullptr;
    if (t->type != GGML_F32 || t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows) {
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
    const std::string blk = "blk." + std::to_string(l) + ".";
    const int dim = hp.n_embd;
    L.attn_norm = vector(blk + "attn_norm.weight", dim);
    matrix(blk + "attn_q.weight", dim, hp.q_dim(), &L.wq);
    matrix(blk + "attn_k.weight", dim, hp.kv_dim(), &L.wk);
    matrix(blk + "attn_v.weight", dim, hp.kv_dim(), &L.wv);
    matrix(blk + "attn_output.weight", hp.q_dim(), dim, &L.wo);
    L.bq = vector(blk + "attn_q.bias", hp.q_dim(), false);
    L.bk = vector(blk + "attn_k.bias", hp.kv_dim(), false);
    L.bv = vector(blk + "attn_v.bias", hp.kv_dim(), false);
}

void Binder::gated_ffn(const HParams &hp, int l, LayerWeights &L, const char *norm) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const int dim = hp.n_embd;
    L.ffn_norm = vector(blk + norm + ".weight", dim);
    matrix(blk + "ffn_gate.weight", dim, hp.n_ff, &L.w_gate);
    matrix(blk + "ffn_up.weight", dim, hp.n_ff, &L.w_up);
    matrix(blk + "ffn_down.weight", hp.n_ff, dim, &L.w_down);
}

void Binder::moe_hparams(HParams &hp, bool norm) {
    hp.n_expert = get_int(prefix + "expert_count", 0, true);
    hp.n_expert_used = get_int(prefix + "expert_used_count", 0, true);
    if (hp.n_expert < 1 || hp.n_expert > 4096 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert) {
        fail("model expert counts are inconsistent (" + std::to_string(hp.n_expert_used) + " of " +
             std::to_string(hp.n_expert) + ")");
        return;
    }
    hp.n_ff_exp = get_int(prefix + "expert_feed_forward_length", hp.n_ff / hp.n_expert_used, false);
    std::string err;
    if (!file.get_bool(prefix + "expert_weights_norm", &norm, &err) && !err.empty()) fail(err);
    hp.expert_norm = norm;
    const float scale = get_float(prefix + "expert_weights_scale", 0.0f);
    hp.expert_scale = scale == 0.0f ? 1.0f : scale; // 0, as files write "none", scales by 1
    if (hp.n_ff_exp < 1 || !std::isfinite(hp.expert_scale)) fail("model expert FFN length or weight scale is invalid");
    // A shared expert is as wide as the file says, else as the dense FFN would be.
    if (file.tensor("blk.0.ffn_up_shexp.weight") != nullptr)
        hp.n_ff_shexp = get_int(prefix + "expert_shared_feed_forward_length", hp.n_ff, false);
}

void Binder::moe_ffn(const HParams &hp, int l, LayerWeights &L) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const int dim = hp.n_embd;
    L.ffn_norm = vector(blk + "ffn_norm.weight", dim);
    matrix(blk + "ffn_gate_inp.weight", dim, hp.n_expert, &L.router);
    experts(blk + "ffn_gate_exps.weight", dim, hp.n_ff_exp, hp.n_expert, &L.gate_exps);
    experts(blk + "ffn_up_exps.weight", dim, hp.n_ff_exp, hp.n_expert, &L.up_exps);
    experts(blk + "ffn_down_exps.weight", hp.n_ff_exp, dim, hp.n_expert, &L.down_exps);
    if (hp.n_ff_shexp == 0) return;
    L.shexp_gate = vector(blk + "ffn_gate_inp_shexp.weight", dim);
    matrix(blk + "ffn_gate_shexp.weight", dim, hp.n_ff_shexp, &L.gate_shexp);
    matrix(blk + "ffn_up_shexp.weight", dim, hp.n_ff_shexp, &L.up_shexp);
    matrix(blk + "ffn_down_shexp.weight", hp.n_ff_shexp, dim, &L.down_shexp);
}

namespace {

const Arch *const kArchs[] = {&kLlama, &kGemma3, &kLfm2, &kPhi3, &kQwen2, &kQwen2Moe, &kQwen3, &kQwen35, &kQwen3Moe, &kSmolLM3};

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
    if (!(factor > 0.0f) || !std::isfinite(factor) || !(rs->attn_factor > 0.0f) || !std::isfinite(rs->attn_factor) ||
        rs->n_ctx_orig < 1)
        return b.fail("model RoPE scaling factor is invalid");
    rs->factor = factor;
    if (type == "none") {
        rs->factor = 1.0f; // a factor is meaningless without scaling
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

// out (rope_dim / 2): each pair's frequency, divided by the factors of tensor
// `factors` when the file has it (Llama 3.1's rope_freqs, Phi-3's LongRoPE sets),
// then scaled as the file says.
bool rope_table(Binder &b, const RopeScaling &rs, const HParams &hp, const std::string &factors,
                std::vector<float> *out) {
    const int half = hp.rope_dim / 2;
    const GGUFTensor *freqs = b.find(factors, false);
    if (freqs != nullptr && (freqs->type != GGML_F32 || freqs->n_dims != 1 || freqs->ne[0] != half))
        return b.fail("tensor " + factors + " has the wrong type or shape");
    // YaRN keeps the pairs that turn many times over the original context (below
    // `low`) extrapolated, interpolates those that turn less than once (above
    // `high`), and ramps between; beta_fast 32 and beta_slow 1 as the files assume.
    const auto corr_dim = [&](double turns) {
        return hp.rope_dim * std::log(rs.n_ctx_orig / (turns * 2 * M_PI)) / (2 * std::log(double{hp.rope_base}));
    };
    const double low = std::max(0.0, std::floor(corr_dim(32.0))),
                 high = std::min(hp.rope_dim - 1.0, std::ceil(corr_dim(1.0)));
    out->resize(half);
    for (int i = 0; i < half; ++i) {
        double f = std::pow(static_cast<double>(hp.rope_base), -2.0 * i / hp.rope_dim);
        if (freqs != nullptr) {
            float div;
            std::memcpy(&div, freqs->data + 4 * i, 4);
            if (!(div > 0.0f)) return b.fail("tensor " + factors + " holds a non-positive factor");
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

// m.inv_freq (and m.inv_freq_long for LongRoPE files) and hp.rope_mscale.
bool rope_frequencies(Binder &b, const RopeScaling &rs, Model &m) {
    HParams &hp = m.hp;
    const bool longrope = b.file.tensor("rope_factors_short.weight") != nullptr ||
                          b.file.tensor("rope_factors_long.weight") != nullptr;
    if (longrope && b.file.tensor("rope_freqs.weight") != nullptr)
        return b.fail("model has both rope_freqs and LongRoPE factors");
    if (!longrope) return rope_table(b, rs, hp, "rope_freqs.weight", &m.inv_freq);
    // LongRoPE (Phi-3): short factors up to the original context, long ones past it.
    if (!rope_table(b, rs, hp, "rope_factors_short.weight", &m.inv_freq) ||
        !rope_table(b, rs, hp, "rope_factors_long.weight", &m.inv_freq_long))
        return false;
    m.rope_ctx_orig = rs.n_ctx_orig;
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
    hp.n_layer = b.get_int(p + "block_count", 0, true);
    // Every layer has a norm and a matrix at least: refuse an absurd block count
    // before allocating for it.
    if (static_cast<uint64_t>(hp.n_layer) * 2 > file.tensors().size()) {
        *error = p + "block_count = " + std::to_string(hp.n_layer) + " but the file holds only " +
                 std::to_string(file.tensors().size()) + " tensors";
        return nullptr;
    }
    std::vector<int> heads, kv_heads; // per layer: hybrid models give 0 to their recurrent layers
    hp.n_head = b.per_layer_int(p + "attention.head_count", hp.n_layer, 0, true, &heads);
    hp.n_head_kv = b.per_layer_int(p + "attention.head_count_kv", hp.n_layer, hp.n_head, false, &kv_heads);
    hp.n_ff = b.get_int(p + "feed_forward_length", 0, true);
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
    if (!(hp.rope_base > 0.0f) || !(hp.norm_eps > 0.0f) || !std::isfinite(hp.rope_base)) {
        *error = "model RoPE base or norm epsilon is invalid";
        return nullptr;
    }
    RopeScaling scaling;
    if (!read_rope_scaling(b, hp, &scaling)) return nullptr;
    hp.window.assign(hp.n_layer, 0);
    hp.state.assign(hp.n_layer, 0);
    arch.load_hparams(b, hp);
    if (!error->empty()) return nullptr;
    for (int l = 0; l < hp.n_layer; ++l) {
        // A layer without heads computes nothing unless the family gives it a recurrent state.
        if ((heads[l] == 0 || kv_heads[l] == 0) && !hp.recurrent(l)) {
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
    arch.bind(b, *model);
    if (!error->empty()) return nullptr;
    if (model->output_norm == nullptr) {
        *error = "model lacks tensor output_norm.weight";
        return nullptr;
    }

    if (!rope_frequencies(b, scaling, *model)) return nullptr;
    hp.rope_mscale = scaling.attn_factor;
    if (scaling.kind == RopeScaling::yarn && scaling.factor > 1.0f) hp.rope_mscale *= 1.0f + 0.1f * std::log(scaling.factor);

    // A tensor nobody bound is a part of the model llmd would not compute.
    for (size_t i = 0; i < b.used.size(); ++i)
        if (!b.used[i]) {
            *error = "model has tensor " + std::string(file.tensors()[i].name) + ", which the " + arch.name +
                     " architecture does not use";
            return nullptr;
        }
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
    for (LayerWeights &L : layers) {
        for (Matrix *m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.router, &L.gate_shexp,
                          &L.up_shexp, &L.down_shexp, &L.conv_in, &L.conv_out, &L.delta_in, &L.delta_gate,
                          &L.delta_beta, &L.delta_alpha, &L.delta_out})
            if (m->data != nullptr) matrices.push_back(m);
        for (std::vector<Matrix> *stack : {&L.gate_exps, &L.up_exps, &L.down_exps})
            for (Matrix &m : *stack) matrices.push_back(&m);
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

// ---- attention memory ----------------------------------------------------

std::vector<KVCache::Layer> KVCache::layout(const HParams &hp, int n_ctx, size_t *ring_elements,
                                            size_t *block_elements) {
    const auto blocks = [](int64_t n) { return static_cast<int>((n + kKeyBlock - 1) / kKeyBlock * kKeyBlock); };
    std::vector<Layer> layers(hp.n_layer);
    size_t offset = 0;
    int paged = 0;
    for (int l = 0; l < hp.n_layer; ++l) {
        // A forward batch writes all its positions before any of them attends, so a
        // ring holds its window behind the batch's first position plus the batch.
        const int w = hp.window[l];
        const int slots = w > 0 ? std::min(blocks(n_ctx), blocks(int64_t{w} + kMaxBatch - 1)) : 0;
        if (hp.recurrent(l)) { // keeps a recurrent state (recurrent.h), no keys and values
            layers[l] = {0, 0, 0};
        } else if (w > 0 && slots < blocks(n_ctx)) {
            layers[l] = {offset, slots, w};
            offset += static_cast<size_t>(slots) * hp.kv_dim();
        } else { // a window as long as the context attends everything a ring would hold
            layers[l] = {0, 0, w, paged++};
        }
    }
    *ring_elements = offset;
    *block_elements = static_cast<size_t>(paged) * hp.kv_dim() * kKVBlock;
    return layers;
}

uint64_t KVCache::bytes_per_token(const HParams &hp, int n_ctx) {
    size_t ring = 0, block = 0;
    layout(hp, n_ctx, &ring, &block);
    return 2ull * block / kKVBlock * sizeof(uint16_t);
}

uint64_t KVCache::ring_bytes(const HParams &hp, int n_ctx) {
    size_t elements = 0, block = 0;
    layout(hp, n_ctx, &elements, &block);
    return 2ull * elements * sizeof(uint16_t);
}

int KVCache::resume_floor() const {
    int floor = 0;
    for (const Layer &L : layers) {
        const int held = held_from(L); // positions below this one were overwritten, or never written
        if (L.paged < 0 && L.window > 0 && held > 0) floor = std::max(floor, held + L.window - 1); // a ring
    }
    return floor;
}

void KVCache::copy_rings(const HParams &hp, const KVCache &from, int begin, int end) {
    const int hd = hp.head_dim;
    for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
        if (layers[l].paged >= 0 || layers[l].slots == 0) continue;
        for (int h = 0; h < hp.n_head_kv; ++h)
            for (int p = begin; p < end; ++p) {
                const Row src = from.row(hp, l, h, p), dst = row(hp, l, h, p);
                for (int d = 0; d < hd; ++d) dst.keys[key_at(dst.index, d, hd)] = src.keys[key_at(src.index, d, hd)];
                std::copy_n(src.values + static_cast<size_t>(src.index) * hd, hd,
                            dst.values + static_cast<size_t>(dst.index) * hd);
            }
    }
}

void KVCache::prepare(int pos) {
    if (pool == nullptr || pool->runs() == 0) return;
    const size_t b = static_cast<size_t>(pos / kKVBlock);
    if (b >= blocks.size()) {
        blocks.reserve(b + 1); // so that no push_back throws with a block acquired
        while (blocks.size() <= b) blocks.push_back(pool->acquire(blocks.empty() ? -1 : blocks.back()));
    } else if (pool->published(blocks[b])) { // immutable: write on a copy
        const int copy = pool->acquire(b > 0 ? blocks[b - 1] : -1);
        pool->copy(copy, blocks[b], kKVBlock);
        pool->release(blocks[b]);
        blocks[b] = copy;
        published = std::min(published, static_cast<int>(b));
    }
}

void KVCache::truncate(int pos) {
    if (pos == 0) {
        high = -1;
        ring_low = 0;
        foreign = false;
    }
    const size_t keep = static_cast<size_t>((pos + kKVBlock - 1) / kKVBlock);
    while (blocks.size() > keep) { // the last first: a retired parent outlives its children
        pool->release(blocks.back());
        blocks.pop_back();
    }
    published = std::min(published, pos / kKVBlock);
}

void KVCache::publish(const std::vector<int32_t> &tokens) {
    if (!sharing || foreign) return;
    const int full = static_cast<int>(tokens.size()) / kKVBlock;
    for (; published < full; ++published) {
        const int i = published, parent = i > 0 ? blocks[i - 1] : -1;
        if (parent >= 0 && !pool->published(parent)) return; // the chain stopped before it
        const int held = pool->publish(blocks[i], parent, scope, tokens.data() + static_cast<size_t>(i) * kKVBlock);
        if (held < 0) return;
        if (held != blocks[i]) { // the same tokens were computed elsewhere: hold that copy
            pool->retain(held);
            pool->release(blocks[i]);
            blocks[i] = held;
        }
    }
}

void KVCache::adopt(const PrefixMatch &m) {
    std::vector<int> next;
    next.reserve(m.blocks.size() + 1);
    for (const int id : m.blocks) {
        pool->retain(id);
        next.push_back(id);
    }
    const size_t i = m.blocks.size();
    if (m.tail_len > 0) {
        if (i < blocks.size() && blocks[i] == m.tail_block && !pool->published(m.tail_block)) {
            pool->retain(m.tail_block); // this session's own block: kept where it is
            next.push_back(m.tail_block);
        } else {
            try {
                next.push_back(pool->acquire(next.empty() ? -1 : next.back()));
            } catch (...) {
                for (const int id : next) pool->release(id);
                throw;
            }
            pool->copy(next.back(), m.tail_block, m.tail_len);
        }
    }
    truncate(0); // which also ends `foreign`: the blocks matched are the scope's own
    blocks = std::move(next);
    high = m.length() - 1;
    published = static_cast<int>(m.blocks.size());
}

void Workspace::reserve(const HParams &hp, int n_tokens) {
    if (n_tokens <= capacity) return;
    const size_t n = static_cast<size_t>(n_tokens);
    x.resize(n * hp.n_embd);
    xb.resize(n * hp.n_embd);
    q.resize(n * hp.q_dim());
    k.resize(n * hp.kv_dim());
    v.resize(n * hp.kv_dim());
    att.resize(n * hp.q_dim());
    hb.resize(n * hp.n_ff);
    hb2.resize(n * hp.n_ff);
    logits_in.resize(n * hp.n_embd);
    rope.resize(n * hp.rope_dim);
    rope_local.resize(n * hp.rope_dim);
    const int widest = std::max({hp.n_embd, hp.q_dim(), hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp});
    xq.resize(quantized_blocks(n_tokens, (widest + QK - 1) / QK * QK));
    capacity = n_tokens;
}

namespace {

// Rows [r0, r1) of a job for n tokens; r0 is a multiple of kPanel.
void matmul_rows(const MatJob &job, int n, int64_t r0, int64_t r1) {
    const Matrix &w = *job.w;
    const int64_t cols = w.cols, rows = w.rows, nb = cols / QK;
    const TypeTraits &traits = *type_traits(w.type);
    const BlockQ8A *xq = traits.activation == Activation::F32 ? nullptr : activations_of(traits, job.xq, n, cols);
    const DotFn dot = kernels().dot[w.type];
    if (w.packed != nullptr) {
        matmul_packed(w.type, w.packed, rows, cols, r0 / kPanel, (r1 + kPanel - 1) / kPanel, xq, n, job.y, rows,
                      job.add);
        return;
    }
    constexpr int kTokenTile = 16; // tokens sharing one pass over the rows
    for (int t0 = 0; t0 < n; t0 += kTokenTile) {
        const int t1 = std::min(n, t0 + kTokenTile);
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t *row = w.row(r);
            for (int t = t0; t < t1; ++t) {
                const float v = dot(row, job.x + t * cols, xq != nullptr ? xq + t * nb : nullptr, cols);
                float &y = job.y[t * rows + r];
                y = job.add ? y + v : v;
            }
        }
    }
}

// y[t * rows + r] += bias[r] for rows [r0, r1) of n tokens.
void add_bias(float *y, const float *bias, int n, int64_t rows, int64_t r0, int64_t r1) {
    for (int t = 0; t < n; ++t)
        for (int64_t r = r0; r < r1; ++r) y[t * rows + r] += bias[r];
}

// Rows [r0, r1) of a job, with its biases and SwiGLU when it has them.
void run_job(const MatJob &j, int n, int64_t r0, int64_t r1) {
    matmul_rows(j, n, r0, r1);
    const int64_t rows = j.w->rows;
    if (j.bias != nullptr) add_bias(j.y, j.bias, n, rows, r0, r1);
    if (j.up == nullptr) return;
    matmul_rows({j.up, j.x, j.xq, j.scratch}, n, r0, r1);
    if (j.up_bias != nullptr) add_bias(j.scratch, j.up_bias, n, rows, r0, r1);
    const auto glu = kernels().glu;
    for (int t = 0; t < n; ++t) glu(j.gelu, j.y + t * rows + r0, j.scratch + t * rows + r0, r1 - r0);
}

// Runs the jobs (which share one input) as one parallel region. Their panels, taken
// as one sequence, are cut into two equal spans a thread: enough to balance the
// threads, and long enough that a decode step's span is one long stream from memory
// (claiming a task and restarting a stream cost more than 64 rows took to read).
// A prefill computes far longer on a panel than it takes to read: eight spans a
// thread, so that a thread which finishes early (or that the OS paused) is helped.
void run_matmuls(ThreadPool &pool, int n, const std::vector<MatJob> &jobs) {
    int64_t panels = 0;
    for (const MatJob &j : jobs) panels += (j.w->rows + kPanel - 1) / kPanel;
    const int spans = n >= kPanel ? 8 : 2;
    const int n_tasks = static_cast<int>(std::min<int64_t>(panels, spans * pool.size()));
    pool.run(n_tasks, [&](int task) {
        const int64_t p0 = panels * task / n_tasks, p1 = panels * (task + 1) / n_tasks;
        int64_t first = 0; // the job's first panel in the sequence
        for (const MatJob &j : jobs) {
            const int64_t own = (j.w->rows + kPanel - 1) / kPanel;
            const int64_t a = std::max(p0, first) - first, b = std::min(p1, first + own) - first;
            if (a < b) run_job(j, j.n > 0 ? j.n : n, a * kPanel, std::min(b * kPanel, j.w->rows));
            first += own;
        }
    });
}

} // namespace

void rmsnorm(float *out, const float *x, const float *weight, int n, float eps,
             double (*sum_squares)(const float *x, int n)) {
    const float scale = static_cast<float>(1.0 / std::sqrt(sum_squares(x, n) / n + eps));
    for (int i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

namespace {

// cs (rope_dim): cos and sin of each rotated pair's angle at position pos.
void rope_angles(float *cs, const HParams &hp, const std::vector<float> &inv_freq, int pos) {
    const float p = static_cast<float>(pos);
    for (int i = 0; i < hp.rope_dim / 2; ++i) {
        const float theta = p * inv_freq[i];
        cs[2 * i] = std::cos(theta) * hp.rope_mscale;
        cs[2 * i + 1] = std::sin(theta) * hp.rope_mscale;
    }
}

// Attention of n_q query heads over positions [p0, p1) of one KV head of a layer's
// cache into out/part (attend_range's partial), in one kernel call over the span's
// runs (attention.h: AttnRun): its pool blocks, or a ring's end and start. Runs start
// at a key block, so a span that starts inside one (a sliding window's first
// positions) has that block's part copied into a block of its own first. The runs
// are fixed by the positions alone, never by the batch. A span lies inside one range
// of kAttnRange positions: at most two pool blocks or two pieces of a ring (whose
// slots are at least kMaxBatch, KVCache::layout) after the copied start.
void attend_span(const HParams &hp, const KVCache &kv, int layer, int head, int p0, int p1, const float *q,
                 int n_q, float scale, float *out, AttnPartial *part) {
    static_assert(kAttnRange % kKVBlock == 0 && kMaxBatch >= kAttnRange);
    const int hd = hp.head_dim;
    const int head_end = std::min(p1, (p0 + kKeyBlock - 1) / kKeyBlock * kKeyBlock); // end of the unaligned part
    AttnRun runs[3];
    int n_runs = 0;
    if (head_end > p0) {
        thread_local std::vector<uint16_t> keys, values;
        keys.assign(static_cast<size_t>(kKeyBlock) * hd, 0);
        values.resize(static_cast<size_t>(kKeyBlock) * hd);
        for (int p = p0; p < head_end; ++p) {
            const KVCache::Row r = kv.row(hp, layer, head, p);
            const int i = p - p0;
            for (int d = 0; d < hd; ++d) keys[key_at(i, d, hd)] = r.keys[key_at(r.index, d, hd)];
            std::copy_n(r.values + static_cast<size_t>(r.index) * hd, hd, &values[static_cast<size_t>(i) * hd]);
        }
        runs[n_runs++] = {keys.data(), values.data(), head_end - p0};
    }
    // Whether positions of n_pos (whole kernel blocks) at run `r` continue in memory at k, v.
    const auto continues = [hd](const AttnRun &r, const uint16_t *k, const uint16_t *v) {
        const size_t n = static_cast<size_t>(r.n_pos) * hd;
        return r.n_pos % kKVBlock == 0 && r.k + n == k && r.v + n == v;
    };
    for (int p = head_end; p < p1;) { // whole key blocks, up to the end of a run at a time
        const KVCache::Row r = kv.row(hp, layer, head, p);
        const int n_pos = std::min(p1 - p, r.count - r.index);
        const size_t at = static_cast<size_t>(r.index) * hd;
        if (n_runs > 0 && continues(runs[n_runs - 1], r.keys + at, r.values + at)) // pool blocks placed in a row
            runs[n_runs - 1].n_pos += n_pos;
        else
            runs[n_runs++] = {r.keys + at, r.values + at, n_pos};
        p += n_pos;
    }
    if (kv.layers[layer].paged >= 0 && static_cast<size_t>(p1 / kKVBlock) < kv.blocks.size()) {
        const KVCache::Row next = kv.row(hp, layer, head, p1); // where the next range starts
        const size_t at = static_cast<size_t>(next.index) * hd;
        if (n_runs == 0 || !continues(runs[n_runs - 1], next.keys + at, next.values + at)) // else the stream goes on
            prefetch_run(next.keys + at, next.values + at, next.count - next.index, hd);
    }
    attend_range(q, n_q, runs, n_runs, hd, scale, out, part);
}

// Query heads one kernel call attends at most in a prefill: the kernel keeps two
// score accumulators per head in registers, and 8 heads (Qwen3-1.7B's 2 per KV
// head × 4 tokens) scored a position in 0.56× the time of 2 heads; 16 spilled.
constexpr int kAttnQueries = 8;

// Each token's queries against its session's cache (which already holds this
// layer's K/V for the token), the query heads of a group sharing each key and value
// row. A token attends [first, pos] (first = 0, or the start of a sliding window),
// cut at fixed positions into ranges of kAttnRange (attention.h) counted from position
// 0, and the ranges' partials are folded in order: a token's output does not depend
// on the batch or the threads; only the schedule does. Many tokens: a task per
// (run of consecutive tokens, KV head) attends their whole contexts; tokens of one
// session that attend the same positions of a range (every range but a token's last,
// in a prefill) attend it in one kernel call, their query heads side by side, so that
// each key and value block is read and converted once for up to kAttnQueries heads.
// The kernel computes every query head on its own, in the same order whatever else
// shares the call, so a token's bits stay those of its decode step. Few tokens over
// a long context: a task per span of a pair's ranges, so that every thread gets a
// share, and the partials are folded afterwards in range order.
void attention(const Model &model, const BatchToken *batch, int n, int layer, Workspace &ws, ThreadPool &pool) {
    const HParams &hp = model.hp;
    const int hd = hp.head_dim, n_kv = hp.n_head_kv, group = hp.n_head / n_kv, q_dim = hp.q_dim();
    const float scale = hp.attn_scale > 0.0f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd));
    const int window = hp.window[layer];
    const auto first_attended = [&](int t) { return window > 0 ? std::max(0, batch[t].pos + 1 - window) : 0; };
    const auto first_range = [&](int t) { return first_attended(t) / kAttnRange; };
    const auto own_ranges = [&](int t) { return attn_range_count(batch[t].pos + 1) - first_range(t); };
    int most = 1; // ranges of the longest attended context
    for (int t = 0; t < n; ++t) most = std::max(most, own_ranges(t));
    const int spans = attn_task_spans(n * n_kv, most, pool.size());
    const size_t pairs = static_cast<size_t>(n) * n_kv, slots = spans > 1 ? pairs * most : pairs;
    // Per slot a range's output and partial, then per pair a running result's partial.
    ws.att_parts.resize(slots * group * hd);
    ws.att_stats.resize((slots + pairs) * group);
    const float *q = ws.q.data();
    float *att = ws.att.data();
    if (spans == 1) {
        // Tokens [t0, t1) against KV head h. Token t0 + i keeps range outputs in slot
        // h * n + t0 + i, so that the tokens of one call write one block of scratch.
        const int per = std::max(1, kAttnQueries / group);
        pool.run((n + per - 1) / per * n_kv, [&](int task) {
            const int h = task % n_kv, t0 = task / n_kv * per, t1 = std::min(n, t0 + per);
            const size_t slot0 = static_cast<size_t>(h) * n + t0;
            float *outs = ws.att_parts.data() + slot0 * group * hd;
            AttnPartial *parts = ws.att_stats.data() + slot0 * group;
            const auto y_of = [&](int t) { return att + t * q_dim + h * group * hd; };
            const auto acc_of = [&](int t) { return ws.att_stats.data() + (slots + t * n_kv + h) * group; };
            // Range R's positions for token t, or {0, 0} when its context does not reach R.
            const auto span_of = [&](int t, int R) {
                const int len = batch[t].pos + 1, first = first_attended(t);
                if (R < first / kAttnRange || R * kAttnRange >= len) return std::pair<int, int>{0, 0};
                return std::pair<int, int>{std::max(first, R * kAttnRange), std::min(len, (R + 1) * kAttnRange)};
            };
            int r_lo = first_range(t0), r_hi = 0;
            for (int t = t0; t < t1; ++t) {
                attend_start(y_of(t), acc_of(t), group, hd);
                r_lo = std::min(r_lo, first_range(t));
                r_hi = std::max(r_hi, attn_range_count(batch[t].pos + 1));
            }
            thread_local std::vector<float> qs; // the call's query heads, token after token
            qs.resize(static_cast<size_t>(per) * group * hd);
            for (int R = r_lo; R < r_hi; ++R) // ranges in order: each token folds its own in order
                for (int i = t0; i < t1;) {
                    const std::pair<int, int> span = span_of(i, R);
                    if (span.second == 0) {
                        ++i;
                        continue;
                    }
                    int j = i + 1; // tokens i..j-1 attend the same positions of the same cache
                    while (j < t1 && batch[j].kv == batch[i].kv && span_of(j, R) == span) ++j;
                    for (int t = i; t < j; ++t)
                        std::copy_n(q + t * q_dim + h * group * hd, group * hd, qs.data() + (t - i) * group * hd);
                    attend_span(hp, *batch[i].kv, layer, h, span.first, span.second, qs.data(), (j - i) * group, scale,
                                outs + (i - t0) * group * hd, parts + (i - t0) * group);
                    for (int t = i; t < j; ++t)
                        attend_fold(y_of(t), acc_of(t), outs + (t - t0) * group * hd, parts + (t - t0) * group, group, hd);
                    i = j;
                }
            for (int t = t0; t < t1; ++t) attend_finish(y_of(t), acc_of(t), group, hd);
        });
        return;
    }
    // Range r of token t's context (the r-th it attends) into slot's output and partial.
    const auto attend_one = [&](int t, int h, int r, size_t slot) {
        const int len = batch[t].pos + 1, first = first_attended(t), range = first / kAttnRange + r;
        const int p0 = std::max(first, range * kAttnRange), p1 = std::min(len, (range + 1) * kAttnRange);
        attend_span(hp, *batch[t].kv, layer, h, p0, p1, q + t * q_dim + h * group * hd, group, scale,
                    ws.att_parts.data() + slot * group * hd, ws.att_stats.data() + slot * group);
    };
    pool.run(static_cast<int>(pairs) * spans, [&](int task) {
        const size_t pair = static_cast<size_t>(task / spans);
        const int c = task % spans, h = static_cast<int>(pair % n_kv), t = static_cast<int>(pair / n_kv);
        const int own = own_ranges(t), r0 = own * c / spans, r1 = own * (c + 1) / spans;
        for (int r = r0; r < r1; ++r) attend_one(t, h, r, pair * most + r);
    });
    for (size_t pair = 0; pair < pairs; ++pair) { // slots pair * most.. hold the pair's ranges in order
        const int t = static_cast<int>(pair / n_kv), h = static_cast<int>(pair % n_kv);
        float *y = att + t * q_dim + h * group * hd;
        AttnPartial *acc = ws.att_stats.data() + (slots + pair) * group;
        attend_start(y, acc, group, hd);
        for (int r = 0, ranges = own_ranges(t); r < ranges; ++r) {
            const size_t slot = pair * most + r;
            attend_fold(y, acc, ws.att_parts.data() + slot * group * hd, ws.att_stats.data() + slot * group, group, hd);
        }
        attend_finish(y, acc, group, hd);
    }
}

} // namespace

// ---- shared ops ------------------------------------------------------------

MatJob project(const Matrix &w, float *y, const float *bias) { return {&w, nullptr, nullptr, y, false, bias}; }

MatJob residual(const Matrix &w, float *y, const float *bias) { return {&w, nullptr, nullptr, y, true, bias}; }

MatJob swiglu(const Matrix &gate, const Matrix &up, float *y, float *scratch, const float *gate_bias,
              const float *up_bias) {
    return {&gate, nullptr, nullptr, y, false, gate_bias, &up, up_bias, scratch};
}

MatJob geglu(const Matrix &gate, const Matrix &up, float *y, float *scratch) {
    MatJob job = swiglu(gate, up, y, scratch);
    job.gelu = true;
    return job;
}

namespace {

// fn(t0, t1) for the pass's tokens cut into one share a thread: per-token work that
// one thread alone made the others wait for in a prefill (norms, RoPE, quantization,
// the KV cache's new rows). A decode step's one token runs on the calling thread.
template <typename Fn> void per_token(const Pass &p, const Fn &fn) {
    const int n_tasks = std::min(p.n, p.pool.size());
    p.pool.run(n_tasks, [&](int task) { fn(p.n * task / n_tasks, p.n * (task + 1) / n_tasks); });
}

} // namespace

void matmuls(const Pass &p, const float *x, std::initializer_list<MatJob> jobs) {
    BlockQ8A *xq = p.ws.xq.data();
    const int64_t cols = jobs.begin()->w->cols;
    bool q8a = false, q8k = false; // the activation formats the jobs' kernels read
    for (const MatJob &j : jobs)
        for (const Matrix *m : {j.w, j.up})
            if (m != nullptr) {
                const Activation a = type_traits(m->type)->activation;
                q8a |= a == Activation::Q8A;
                q8k |= a == Activation::Q8K;
            }
    per_token(p, [&](int t0, int t1) { quantize_rows_part(x, p.n, cols, xq, t0, t1, q8a, q8k); });
    std::vector<MatJob> &fed = p.ws.jobs; // kept between calls: no allocation per region
    fed.assign(jobs);
    for (MatJob &j : fed) {
        j.x = x;
        j.xq = xq;
    }
    run_matmuls(p.pool, p.n, fed);
}

void rmsnorm_rows(const Pass &p, float *out, const float *x, const float *weight) {
    const int dim = p.hp.n_embd;
    per_token(p, [&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) rmsnorm(out + t * dim, x + t * dim, weight, dim, p.hp.norm_eps);
    });
}

void moe(const Pass &p, const LayerWeights &L, const float *xb, float *x) {
    const HParams &hp = p.hp;
    const int n = p.n, dim = hp.n_embd, n_exp = hp.n_expert, k = hp.n_expert_used;
    Workspace &ws = p.ws;
    const size_t ff = static_cast<size_t>(hp.n_ff_exp), shared_ff = static_cast<size_t>(hp.n_ff_shexp);
    ws.router.resize(static_cast<size_t>(n) * n_exp);
    const size_t rows = static_cast<size_t>(n) * k; // (token, chosen expert) pairs
    ws.moe_in.resize(rows * dim);
    ws.moe_out.resize(rows * dim);
    ws.moe_h.resize(rows * ff);
    ws.moe_h2.resize(std::max(rows * ff, n * shared_ff)); // the up-projection scratch of either
    ws.moe_xq.resize(std::max(quantized_blocks(static_cast<int>(rows), dim), quantized_blocks(static_cast<int>(rows), hp.n_ff_exp)));
    ws.moe_acc.assign(static_cast<size_t>(n) * dim, 0.0f);
    // The shared expert reads xb as the router does: one region computes both, and its
    // hidden rows wait in moe_shared until the routed experts are summed.
    const bool shared = L.up_shexp.data != nullptr;
    if (shared) {
        ws.moe_shared.resize(n * shared_ff);
        matmuls(p, xb, {project(L.router, ws.router.data()),
                        swiglu(L.gate_shexp, L.up_shexp, ws.moe_shared.data(), ws.moe_h2.data())});
    } else {
        matmuls(p, xb, {project(L.router, ws.router.data())});
    }
    // Per token: softmax over the experts, the top k (ties to the lower index), and
    // their weights; chosen (n, n_expert) holds a token's weight for each chosen expert.
    std::vector<float> &chosen = ws.moe_weights;
    chosen.assign(static_cast<size_t>(n) * n_exp, 0.0f);
    std::vector<int> order(n_exp);
    for (int t = 0; t < n; ++t) {
        float *prob = ws.router.data() + static_cast<size_t>(t) * n_exp;
        const float mx = *std::max_element(prob, prob + n_exp);
        float sum = 0.0f;
        for (int e = 0; e < n_exp; ++e) sum += prob[e] = std::exp(prob[e] - mx);
        for (int e = 0; e < n_exp; ++e) prob[e] /= sum;
        for (int e = 0; e < n_exp; ++e) order[e] = e;
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int a, int b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); });
        float total = 0.0f;
        for (int i = 0; i < k; ++i) total += prob[order[i]];
        for (int i = 0; i < k; ++i) {
            const float w = hp.expert_norm ? prob[order[i]] / total : prob[order[i]];
            chosen[static_cast<size_t>(t) * n_exp + order[i]] = w * hp.expert_scale;
        }
    }
    // The tokens grouped per expert, expert after expert, in moe_in. Every group is
    // its jobs' whole batch (quantized on its own), and all groups run as one parallel
    // region for gate and up, then one for down: two regions however many experts the
    // batch reaches and however few tokens each gets (one, in a decode step).
    ws.moe_groups.clear();
    ws.moe_tokens.clear();
    for (int e = 0; e < n_exp; ++e) {
        const int row = static_cast<int>(ws.moe_tokens.size());
        for (int t = 0; t < n; ++t)
            if (chosen[static_cast<size_t>(t) * n_exp + e] != 0.0f) ws.moe_tokens.push_back(t);
        if (static_cast<int>(ws.moe_tokens.size()) > row)
            ws.moe_groups.push_back({e, row, static_cast<int>(ws.moe_tokens.size()) - row});
    }
    for (size_t i = 0; i < ws.moe_tokens.size(); ++i)
        std::copy_n(xb + static_cast<size_t>(ws.moe_tokens[i]) * dim, dim, ws.moe_in.data() + i * dim);
    // Each group's jobs over its rows of `in` (cols wide), quantized into moe_xq.
    const auto run_groups = [&](const float *in, int64_t cols, const auto &job_of) {
        ws.jobs.clear();
        size_t q = 0;
        for (const Workspace::ExpertGroup &g : ws.moe_groups) {
            MatJob job = job_of(g);
            job.x = in + static_cast<size_t>(g.row) * cols;
            job.xq = ws.moe_xq.data() + q;
            job.n = g.n;
            quantize_rows(job.x, g.n, cols, ws.moe_xq.data() + q);
            q += quantized_blocks(g.n, cols);
            ws.jobs.push_back(job);
        }
        run_matmuls(p.pool, n, ws.jobs);
    };
    run_groups(ws.moe_in.data(), dim, [&](const Workspace::ExpertGroup &g) {
        return swiglu(L.gate_exps[g.expert], L.up_exps[g.expert], ws.moe_h.data() + g.row * ff,
                      ws.moe_h2.data() + g.row * ff);
    });
    run_groups(ws.moe_h.data(), hp.n_ff_exp, [&](const Workspace::ExpertGroup &g) {
        return project(L.down_exps[g.expert], ws.moe_out.data() + static_cast<size_t>(g.row) * dim);
    });
    for (const Workspace::ExpertGroup &g : ws.moe_groups) // each token sums its experts in expert order
        for (int i = g.row; i < g.row + g.n; ++i) {
            const int t = ws.moe_tokens[i];
            const float w = chosen[static_cast<size_t>(t) * n_exp + g.expert];
            float *acc = ws.moe_acc.data() + static_cast<size_t>(t) * dim;
            const float *y = ws.moe_out.data() + static_cast<size_t>(i) * dim;
            for (int d = 0; d < dim; ++d) acc[d] += w * y[d];
        }
    if (shared) {
        matmuls(p, ws.moe_shared.data(), {project(L.down_shexp, ws.moe_out.data())});
        for (int t = 0; t < n; ++t) {
            const float *in = xb + static_cast<size_t>(t) * dim, *y = ws.moe_out.data() + static_cast<size_t>(t) * dim;
            float gate = 0.0f;
            for (int d = 0; d < dim; ++d) gate += in[d] * L.shexp_gate[d];
            const float w = 1.0f / (1.0f + std::exp(-gate));
            float *acc = ws.moe_acc.data() + static_cast<size_t>(t) * dim;
            for (int d = 0; d < dim; ++d) acc[d] += w * y[d];
        }
    }
    add_rows(p, x, ws.moe_acc.data());
}

void add_rows(const Pass &p, float *x, const float *y) {
    const size_t n = static_cast<size_t>(p.n) * p.hp.n_embd;
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

void rmsnorm_heads(const Pass &p, float *x, int n_heads, const float *weight) {
    const int hd = p.hp.head_dim;
    per_token(p, [&](int t0, int t1) {
        for (int i = t0 * n_heads; i < t1 * n_heads; ++i) rmsnorm(x + i * hd, x + i * hd, weight, hd, p.hp.norm_eps);
    });
}

void rope(const Pass &p, float *x, int n_heads, Rope style, bool local) {
    const HParams &hp = p.hp;
    const int half = hp.rope_dim / 2;
    // Pair i of a head: dims (2i, 2i + 1) adjacent, (i, i + half) NEOX.
    const int first = style == Rope::adjacent ? 2 : 1, second = style == Rope::adjacent ? 1 : half;
    per_token(p, [&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) {
            const float *cs = (local ? p.ws.rope_local : p.ws.rope).data() + t * hp.rope_dim;
            float *xt = x + static_cast<size_t>(t) * n_heads * hp.head_dim;
            for (int i = 0; i < half; ++i) {
                const float c = cs[2 * i], s = cs[2 * i + 1];
                for (int h = 0; h < n_heads; ++h) {
                    float *v = xt + h * hp.head_dim + first * i;
                    const float a = v[0], b = v[second];
                    v[0] = a * c - b * s;
                    v[second] = a * s + b * c;
                }
            }
        }
    });
}

void project_qkv(const Pass &p, const LayerWeights &L) {
    rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
    matmuls(p, p.xb, {project(L.wq, p.q, L.bq), project(L.wk, p.k, L.bk), project(L.wv, p.v, L.bv)});
}

void rope_attention(const Pass &p, const LayerWeights &L, int layer, Rope style) {
    project_qkv(p, L);
    rope(p, p.q, p.hp.n_head, style);
    rope(p, p.k, p.hp.n_head_kv, style);
    attend(p, layer);                               // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x, L.bo)}); // x += att woᵀ
}

void qk_norm_attention(const Pass &p, const LayerWeights &L, int layer) {
    project_qkv(p, L);
    rmsnorm_heads(p, p.q, p.hp.n_head, L.q_norm); // each head to unit RMS, then scaled
    rmsnorm_heads(p, p.k, p.hp.n_head_kv, L.k_norm);
    rope(p, p.q, p.hp.n_head, Rope::neox);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox);
    attend(p, layer);                         // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += att woᵀ
}

void swiglu_ffn(const Pass &p, const LayerWeights &L) {
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    matmuls(p, p.xb, {swiglu(L.w_gate, L.w_up, p.hb, p.hb2, L.b_gate, L.b_up)});
    matmuls(p, p.hb, {residual(L.w_down, p.x, L.b_down)});
}

void attend(const Pass &p, int layer) {
    const HParams &hp = p.hp;
    const int kv_dim = hp.kv_dim();
    for (int t = 0; t < p.n; ++t) p.batch[t].kv->high = std::max(p.batch[t].kv->high, p.batch[t].pos);
    const auto to_f16 = kernels().to_f16;
    per_token(p, [&](int t0, int t1) { // the tokens' rows are distinct: a batch never holds one position twice
        for (int t = t0; t < t1; ++t)
            for (int h = 0; h < hp.n_head_kv; ++h) {
                const KVCache::Row r = p.batch[t].kv->row(hp, layer, h, p.batch[t].pos);
                const float *kh = p.ws.k.data() + t * kv_dim + h * hp.head_dim;
                for (int d = 0; d < hp.head_dim; ++d) r.keys[key_at(r.index, d, hp.head_dim)] = fp32_to_fp16(kh[d]);
                to_f16(p.ws.v.data() + t * kv_dim + h * hp.head_dim, r.values + static_cast<size_t>(r.index) * hp.head_dim,
                       hp.head_dim);
            }
    });
    attention(p.model, p.batch, p.n, layer, p.ws, p.pool);
}

// ---- the forward pass ------------------------------------------------------

void forward(const Model &model, const BatchToken *batch, int n, Workspace &ws, ThreadPool &pool,
             float *logits, float *hidden) {
    const HParams &hp = model.hp;
    const int dim = hp.n_embd;
    ws.reserve(hp, n);
    for (int t = 0; t < n; ++t) batch[t].kv->prepare(batch[t].pos); // every block the pass writes, before it writes
    const Pass pass{model, hp, batch, n, ws, pool};
    // A recurrent state holds positions 0..pos-1: each token must be the next one of
    // its session (in batch order), or its layers would fold it into the wrong state.
    for (int t = 0; t < n; ++t) {
        RecurrentState *rs = batch[t].rs;
        if (rs == nullptr || rs->empty()) continue;
        if (rs->pos != batch[t].pos)
            throw std::logic_error("recurrent state at position " + std::to_string(rs->pos) + " is fed position " +
                                   std::to_string(batch[t].pos));
        rs->pos = batch[t].pos + 1;
    }

    float *x = pass.x;
    for (int t = 0; t < n; ++t) {
        type_traits(model.tok_embd.type)->to_float(model.tok_embd.row(batch[t].token), x + t * dim, dim);
        if (hp.embd_scale != 1.0f)
            for (int i = 0; i < dim; ++i) x[t * dim + i] *= hp.embd_scale;
        rope_angles(ws.rope.data() + t * hp.rope_dim, hp, model.inv_freq, batch[t].pos); // shared by every layer
        if (!model.inv_freq_local.empty())
            rope_angles(ws.rope_local.data() + t * hp.rope_dim, hp, model.inv_freq_local, batch[t].pos);
    }

    for (int l = 0; l < hp.n_layer; ++l) model.arch->layer(pass, model.layers[l], l);

    float *normed = hidden != nullptr ? hidden : ws.logits_in.data();
    int n_out = 0;
    for (int t = 0; t < n; ++t)
        if (batch[t].logits)
            rmsnorm(normed + static_cast<size_t>(n_out++) * dim, x + t * dim, model.output_norm, dim, hp.norm_eps);
    if (n_out > 0 && hidden == nullptr) {
        const Pass out{model, hp, batch, n_out, ws, pool}; // only the rows that want logits
        matmuls(out, ws.logits_in.data(), {project(model.output, logits, model.output_b)});
        if (hp.logit_softcap > 0.0f)
            for (size_t i = 0; i < static_cast<size_t>(n_out) * hp.n_vocab; ++i)
                logits[i] = hp.logit_softcap * std::tanh(logits[i] / hp.logit_softcap);
    }
}

} // namespace llmd
