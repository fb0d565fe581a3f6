// model.h — a decoder-only transformer: hyperparameters and weights bound to the
// GGUF mapping, the per-session KV cache, the shared ops every architecture builds
// its layers from (arch/arch.h), and one forward pass over a batch of tokens that
// may belong to different sessions (prefill is a batch of one session's tokens;
// batched decode is one token from each of several sessions).
#pragma once

#include "ops/attention.h"
#include "format/gguf.h"
#include "kernels/kernels.h"
#include "quants/quants.h"
#include "runtime/threadpool.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace llmd {

// A weight matrix in GGUF layout: `rows` rows of `cols` contiguous elements, and
// its repacked form (quants.h) when this build has one for its type.
struct Matrix {
    uint32_t type = 0;
    int64_t cols = 0; // ne[0], the input dimension
    int64_t rows = 0; // ne[1], the output dimension
    size_t row_bytes = 0;
    const uint8_t *data = nullptr;
    const uint8_t *packed = nullptr;
    float scale = 1.0f; // the file's per-tensor scale (<name>.scale): products are multiplied by it
    const uint8_t *row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// Heap bytes aligned to a cache line, so that packed panels never straddle lines;
// with `huge`, aligned to 2 MB and offered to the kernel as transparent huge pages.
struct AlignedBytes {
    std::unique_ptr<uint8_t, void (*)(void *)> raw{nullptr, std::free};
    uint8_t *data = nullptr;
    explicit AlignedBytes(size_t n, bool huge = false);
};

// The activation of a gated unit: silu(gate) * up, gelu(gate) * up (GELU's tanh
// approximation), relu(gate) * up, or gpt-oss's SwiGLU (swiglu_oai in model.cpp: the gate
// capped, the up clamped, a sigmoid of 1.702 · gate, and up + 1).
enum class Glu { silu, gelu, relu, swiglu_oai };

struct HParams {
    int n_vocab = 0;
    int n_ctx_train = 0;
    int n_embd = 0;    // dim
    int n_layer = 0;   // the blocks forward() runs
    int n_layer_nextn = 0; // multi-token-prediction blocks after them (Model::nextn)
    int n_head = 0;
    int n_head_kv = 0;
    int n_ff = 0;      // hidden dim of the FFN
    int matrix_input = 0; // the widest input of the model's matrices, as bound (not read): what
                          // Workspace::xq holds quantized, a token at a time
    int head_dim = 0;
    int rope_dim = 0;  // leading dims of each head that RoPE rotates
    float rope_base = 10000.0f;
    float rope_mscale = 1.0f; // multiplies cos and sin (YaRN's magnitude correction, attn_factor)
    float yarn_beta_fast = 32.0f; // YaRN keeps pairs that turn more than this many times over the
    float yarn_beta_slow = 1.0f;  // original context, interpolates those turning less than this
    float yarn_log_mul = 0.0f;    // YaRN's magnitude (1 + 0.1 ln f) is divided by (1 + 0.1 · this · ln f) when set
    float norm_eps = 1e-5f;
    float rope_base_local = 0.0f; // RoPE base of the sliding-window layers, if they turn by angles of their own
                                  // (Model::inv_freq_local); 0: they turn as the global layers
    int rope_dim_local = 0;       // the dims of their heads they turn, where that differs (Gemma 4); 0: rope_dim
    // How those angles follow the file's RoPE scaling, as llama.cpp's graph of the family turns
    // its sliding-window layers: unscaled, with the context's magnitude factor (Gemma 3:
    // freq_scale_swa 1); scaled and corrected as the global layers (gpt-oss, SmallThinker:
    // freq_scale_swa the trained scale, so a factor scales them linearly even where the
    // scaling type is none); or plain, neither scaled nor corrected (OLMo 3).
    enum class LocalRope { unscaled, scaled, plain } rope_local = LocalRope::unscaled;
    float rope_mscale_local = 1.0f; // multiplies their cos and sin
    float attn_scale = 0.0f;    // scale of attention scores; 0: 1/√head_dim
    float attn_softcap = 0.0f;  // attention scores become c·tanh(score / c); 0: none (ops/attention.h: AttnScale)
    float embd_scale = 1.0f;    // multiplies the token embeddings (Gemma: √n_embd)
    float logit_softcap = 0.0f; // final logits become c·tanh(logits / c); 0: none
    float logit_scale = 1.0f;   // final logits are multiplied by 1 / this (Granite's logits_scaling; the
                                // inverse of Cohere 2's logit_scale, which multiplies)
    bool layer_norm = false;    // the final norm subtracts the mean first (a LayerNorm without bias: Cohere 2)
    float residual_scale = 1.0f; // multiplies a sublayer's output before it joins the residual (Granite)
    float attn_temp_scale = 0.0f; // queries at position p times 1 + this · ln(⌊p / attn_temp_floor⌋ + 1); 0: none
    int attn_temp_floor = 0;      // (Llama 4's attention temperature, Mistral 3's)
    // Per block, the prediction blocks after the layers included (all 0 there):
    std::vector<int> window;    // positions a block attends, its own included; 0: all
    // The width of a block's heads and its key/value heads: head_dim and n_head_kv (the
    // widest, which size the workspace), but where a family's layers differ (Gemma 4).
    std::vector<int> layer_head_dim, layer_kv_heads;
    std::vector<int> kv_from;   // the block whose keys and values a block attends: itself, or an
                                // earlier one whose cache it shares (Gemma 4), writing none of its own
    std::vector<int> state;     // floats of recurrent state a layer keeps per session
                                // instead of keys and values (recurrent.h); 0: an attention layer
    int conv_len = 0;           // short convolutions: positions each one spans, its own included
    struct DeltaNet {           // Gated DeltaNet layers (Qwen3.5)
        int k_heads = 0;        // query and key heads; value head h reads key head h % k_heads
        int v_heads = 0;        // value heads, each with its own (head_dim × head_dim) state
        int head_dim = 0;       // of queries, keys and values alike
        int qk_dim() const { return k_heads * head_dim; }
        int v_dim() const { return v_heads * head_dim; }
        int conv_dim() const { return 2 * qk_dim() + v_dim(); } // q, k, v: the convolved channels
    } delta;
    struct Mamba2 {             // Mamba-2 layers (Granite 4.0-H)
        int heads = 0;          // each with its own (head_dim × d_state) state and decay
        int head_dim = 0;       // channels of x (and of y, z) per head
        int groups = 0;         // of B and C; head h reads group h / (heads / groups)
        int d_state = 0;
        int inner() const { return heads * head_dim; }
        int conv_dim() const { return inner() + 2 * groups * d_state; } // x, B, C: the convolved channels
    } mamba;
    std::vector<bool> rope_fixed; // (rope_dim / 2) pairs text positions leave unrotated (multi-section RoPE)
    int n_expert = 0;           // MoE: experts per layer,
    int n_expert_used = 0;      // experts each token is routed to,
    int n_ff_exp = 0;           // hidden dim of one expert
    bool expert_norm = true;    // the chosen experts' weights renormalised to sum to 1
    float expert_scale = 1.0f;  // then multiplied by this
    int n_ff_shexp = 0;         // hidden dim of the shared expert every token also runs; 0: none
    int n_embd_per_layer = 0;   // Gemma 4: floats of each layer's own input per token (Model::ple_embd); 0: none
    // Router scores to expert weights: a softmax, a sigmoid or the square root of the softplus
    // of each score (the top k by probability chosen), or the top k by score chosen and a
    // softmax over theirs alone (gpt-oss; expert_gating_func 3).
    enum class Gating { softmax, sigmoid, softmax_chosen, sqrt_softplus } gating = Gating::softmax;
    Glu expert_glu = Glu::silu; // the experts' gated unit (ReLU: SmallThinker; swiglu_oai: gpt-oss)
    int q_dim() const { return n_head * head_dim; }
    int kv_dim() const { return n_head_kv * head_dim; }
    int hd(int block) const { return layer_head_dim[block]; }
    int kv_heads(int block) const { return layer_kv_heads[block]; }
    bool recurrent(int layer) const { return state[layer] > 0; }
};

// One layer's weights; a tensor the architecture does not have, or the file leaves
// out where that is allowed, is null (vectors) or has no data (matrices).
struct LayerWeights {
    const float *attn_norm = nullptr; // (dim)
    Matrix wq;                        // (q_dim, dim)
    Matrix wk;                        // (kv_dim, dim)
    Matrix wv;                        // (kv_dim, dim)
    Matrix wo;                        // (dim, q_dim)
    const float *bq = nullptr;        // (q_dim) attention biases
    const float *bk = nullptr;        // (kv_dim)
    const float *bv = nullptr;        // (kv_dim)
    const float *bo = nullptr;        // (dim)
    const float *attn_sinks = nullptr; // (n_head) a logit per query head that joins its softmax's denominator
    const float *q_norm = nullptr;    // (head_dim) RMS norm of each query head
    const float *k_norm = nullptr;    // (head_dim) RMS norm of each key head
    const float *attn_post_norm = nullptr; // (dim) norm of the attention output (Gemma)
    const float *ffn_norm = nullptr;  // (dim)
    Matrix w_gate;                    // (ff, dim)
    Matrix w_up;                      // (ff, dim)
    Matrix w_down;                    // (dim, ff)
    const float *b_gate = nullptr;    // (ff) FFN biases
    const float *b_up = nullptr;      // (ff)
    const float *b_down = nullptr;    // (dim)
    const float *ffn_post_norm = nullptr; // (dim) norm of the FFN output (Gemma)
    Matrix router;                    // (n_expert, dim) MoE: expert scores of a token
    std::vector<Matrix> gate_exps;    // n_expert × (n_ff_exp, dim)
    std::vector<Matrix> up_exps;      // n_expert × (n_ff_exp, dim)
    std::vector<Matrix> down_exps;    // n_expert × (dim, n_ff_exp)
    const float *router_b = nullptr;  // (n_expert) added to the router's scores
    const float *b_gate_exps = nullptr; // (n_expert, n_ff_exp) each expert's biases, where the family has them
    const float *b_up_exps = nullptr;   // (n_expert, n_ff_exp)
    const float *b_down_exps = nullptr; // (n_expert, dim)
    Matrix conv_in;                   // (3 · dim, dim) short convolution (LFM2): gates b, c and input x
    const float *conv_w = nullptr;    // (channels, conv_len) each channel's filter, oldest position first
    Matrix conv_out;                  // (dim, dim)
    Matrix delta_in;                  // (conv_dim, dim) Gated DeltaNet (Qwen3.5): q, k, v before the convolution
    Matrix delta_gate;                // (v_dim, dim) z, the output gate
    Matrix delta_beta;                // (v_heads, dim) learning rate, through a sigmoid
    Matrix delta_alpha;               // (v_heads, dim) decay, through softplus(· + delta_dt) · delta_a
    const float *delta_dt = nullptr;  // (v_heads)
    const float *delta_a = nullptr;   // (v_heads) -exp(A_log), negative
    const float *delta_norm = nullptr; // (head_dim) RMS norm of each head's output
    Matrix delta_out;                 // (dim, v_dim)
    Matrix ssm_in;                    // (inner + conv_dim + heads, dim) Mamba-2 (Granite 4.0-H): z, x B C, dt
    const float *conv_b = nullptr;    // (conv_dim) optional bias after the convolution (Mamba-2)
    const float *ssm_dt = nullptr;    // (heads) added to dt before its softplus
    const float *ssm_a = nullptr;     // (heads) -exp(A_log), negative: the decay is exp(dt · a)
    const float *ssm_d = nullptr;     // (heads) the skip: y += x · d
    const float *ssm_norm = nullptr;  // (inner) RMS norm of y, over each group's inner / groups channels
    Matrix ssm_out;                   // (dim, inner)
    const float *expert_bias = nullptr; // (n_expert) added to the probabilities to choose experts, not to weigh them
    const float *shexp_gate = nullptr; // (dim) the shared expert's weight for a token is sigmoid(xb · this); null: 1
    Matrix gate_shexp;                // (n_ff_shexp, dim)
    Matrix up_shexp;                  // (n_ff_shexp, dim)
    Matrix down_shexp;                // (dim, n_ff_shexp)
    Matrix ple_gate;                  // (n_embd_per_layer, dim) Gemma 4: the gate of the layer's per-layer input,
    Matrix ple_proj;                  // (dim, n_embd_per_layer) its projection back
    const float *ple_norm = nullptr;  // (dim) and its norm
    const float *out_scale = nullptr; // (1) multiplies the residual stream after the block (Gemma 4)
    const float *route_scale = nullptr; // (dim) Gemma 4: the router reads rmsnorm(x) / √dim times this,
    const float *exps_norm = nullptr;   // (dim) the experts read rmsnorm(x) by this,
    const float *exps_post_norm = nullptr; // (dim) their weighted sum is normed by this,
    const float *mlp_post_norm = nullptr;  // (dim) and the dense FFN's output beside them by this
};

// A multi-token-prediction block (nextn_predict_layers; blk.<n_layer + i>): a decoder
// block of the family's own kind over eh_proj · [enorm(embedding), hnorm(hidden)],
// with an embedding and an output head of its own where the file has them. forward()
// does not run it; forward_nextn does, for drafting.
struct NextNWeights {
    LayerWeights block;
    Matrix eh_proj;                    // (dim, 2 · dim)
    const float *enorm = nullptr;      // (dim) norm of the next token's embedding
    const float *hnorm = nullptr;      // (dim) norm of the previous position's hidden state
    Matrix embed_tokens;               // (vocab, dim) optional: else the model's token_embd
    Matrix head;                       // (vocab, dim) optional: else the model's output
    const float *head_norm = nullptr;  // (dim) optional: else output_norm
};

// Every tensor whose type the engine has no kernels for, grouped by type and named
// ("...tensor type Q3_K (blk.0.attn_q.weight and 29 more)"); empty when it can run all.
std::string unsupported_tensors(const GGUFFile &file);

struct Arch; // arch/arch.h

// A reranker's classification head (rank pooling, llmd_session_embed): one row per
// label, over the final-normed hidden state the pooling picks; softmaxed over the
// labels where the family's graph does (llama.cpp: Qwen3's "yes" and "no" rows).
struct Classifier {
    Matrix out; // (labels, dim); no rows when the file has no head
    bool softmax = false;
};

// The head's scores of a pooled state (dim floats) into out (one per label), its rows
// decoded to floats and the dot products taken in double.
void classify(const Classifier &head, const float *state, float *out);

struct Model {
    const Arch *arch = nullptr;
    HParams hp;
    Matrix tok_embd;             // (vocab, dim)
    const float *output_norm;    // (dim)
    Matrix output;               // (vocab, dim); token_embd when the model ties them
    const float *output_b = nullptr; // (vocab) optional bias of the output head
    Classifier classifier;
    std::vector<float> inv_freq; // (rope_dim / 2) RoPE frequency per pair, scaling included
    std::vector<float> inv_freq_long; // LongRoPE: the frequencies past rope_ctx_orig, else empty
    int rope_ctx_orig = 0;
    std::vector<float> inv_freq_local; // (rope_dim / 2) of the sliding-window layers if they have their own
                                       // (hp.rope_base_local, hp.rope_local)
    // Gemma 4's per-layer inputs (HParams::n_embd_per_layer): each token's row of
    // ple_embd, and the embeddings' projection by ple_model_proj normed by ple_proj_norm.
    Matrix ple_embd;                  // (vocab, n_layer · n_embd_per_layer)
    Matrix ple_model_proj;            // (n_layer · n_embd_per_layer, dim)
    const float *ple_proj_norm = nullptr; // (n_embd_per_layer)
    std::vector<LayerWeights> layers;
    std::vector<NextNWeights> nextn;  // (n_layer_nextn) run by forward_nextn alone
    std::vector<std::string> warnings; // tensors the file holds that llmd knowingly leaves unused
    // Block l's weights: a layer's, or from n_layer on a prediction block's.
    const LayerWeights &block(int l) const { return l < hp.n_layer ? layers[l] : nextn[l - hp.n_layer].block; }
    std::unique_ptr<AlignedBytes> packed; // storage of the matrices' packed forms
    uint64_t weight_bytes = 0;        // bytes of weights read per token: packed forms replace originals

    // Binds the weights of a GGUF as `arch` lays them out; nullptr with *error on any
    // mismatch, including a tensor of the file that the architecture did not bind.
    static std::unique_ptr<Model> load(const GGUFFile &file, const Arch &arch, int n_vocab, std::string *error);
    // Picks what depends on the context the engine runs at: LongRoPE's long
    // frequencies when n_ctx exceeds the original context (as llama.cpp does).
    void use_context(int n_ctx);

private:
    void pack(); // repacks the matrices this build has kernels for (quants.h)
};

// Reads a model's metadata and binds its tensors for Model::load and the
// architectures, remembering which tensors were bound so that none goes unused.
// The first failure is kept in *error; later calls only return a fallback.
struct Binder {
    const GGUFFile &file;
    std::string *error;
    std::string prefix;     // "<architecture>.", the start of the family's metadata keys
    std::vector<bool> used; // per tensor of the file: bound by the architecture
    int64_t widest_input = 0; // of the matrices bound (HParams::matrix_input)
    int n_layer_nextn = 0;  // per-layer arrays may also cover the multi-token-prediction blocks
    bool ffn_scales = true; // the family's FFN applies its weights' scales (llama.cpp's graphs of some do not)
    bool shexp_gated = true; // a shared expert has its gate (ffn_gate_inp_shexp); Ernie 4.5's has none
    bool expert_widths_per_layer = false; // expert_feed_forward_length may be given per layer (layers agreeing),
                                          // as llama.cpp reads it for some families
    bool mlp_layers = false;   // a layer without heads or a recurrent state is a feed-forward layer (Nemotron-H)
    bool layer_shapes = false; // the family's layers may differ in key/value heads and FFN width
                               // (HParams::layer_kv_heads; its own binding reads each layer's)
    // Tensors accepted and not applied, as llama.cpp loads and leaves them (scales, see
    // scales; the attention output bias of a family whose graph passes none): one warning.
    std::vector<std::string> unapplied;
    std::vector<std::string> warnings; // tensors left unused on purpose, for Model::warnings

    Binder(const GGUFFile &file, std::string *error, const std::string &arch_name);
    bool fail(const std::string &msg);
    int get_int(const std::string &key, int fallback, bool required);
    // A count the file gives once or per layer (an array of n_layer, or of n_layer +
    // n_layer_nextn as llama.cpp writes it for files with prediction blocks): *values
    // per layer, returning the largest value; with must_agree, layers that have any
    // must give the same (else the caller checks it, with agree()).
    int per_layer_int(const std::string &key, int n_layer, int fallback, bool required, std::vector<int> *values,
                      bool must_agree = true);
    // Fails for key unless the layers that have a non-zero value give the same.
    bool agree(const std::string &key, const std::vector<int> &values);
    // A flag the file gives per layer as llama.cpp reads one: an array (n_layer long, or
    // n_layer + n_layer_nextn) of bools, int32 or uint32 (nonzero: set). False when the
    // key is absent or a scalar (the caller's rule applies); fails on another shape.
    bool layer_flags(const std::string &key, int n_layer, std::vector<bool> *flags);
    bool covers_layers(uint64_t count, int n_layer) const; // an array's length is n_layer (+ n_layer_nextn)
    // Which layers attend over a sliding window, as llama.cpp reads
    // attention.sliding_window_pattern: a flag per layer (layer_flags), or else a period
    // n (the key's, else `period`): layer l is local unless l % n == n - 1 (with
    // `dense_first`, unless l % n == 0); n = 0 makes every layer local.
    std::vector<bool> swa_layers(int n_layer, int period, bool dense_first = false);
    // The sliding-window layers' own RoPE (HParams::rope_base_local, rope_local = how):
    // the base rope.freq_base_swa, else `fallback`.
    void swa_rope(HParams &hp, float fallback, HParams::LocalRope how);
    float get_float(const std::string &key, float fallback);
    const GGUFTensor *find(const std::string &name, bool required);
    // A matrix [cols, rows] and, for the weights llama.cpp scales (attention, FFN, experts,
    // the recurrent projections), its per-tensor scale <base>.scale when the file has one
    // (F32 [1]; see scales).
    bool matrix(const std::string &name, int64_t cols, int64_t rows, Matrix *m, bool required = true);
    // A stack of n matrices [cols, rows, n] (MoE experts), one Matrix per slice, each with
    // its entry of the stack's scales (F32 [n]) when the file has them.
    bool experts(const std::string &name, int64_t cols, int64_t rows, int n, std::vector<Matrix> *out);
    // The per-tensor scales of weight `name` (n values, one per expert of a stack) into
    // out, or false when the file has none or the family does not apply them (FFN
    // scales without ffn_scales); its input scales, which llama.cpp never applies, and
    // the scales it does not apply are accepted and listed in `unapplied`.
    bool scales(const std::string &name, int64_t n, float *out);
    // A fused matrix (rows = the sum of parts' rows) bound as consecutive row ranges.
    bool split_matrix(const std::string &name, int64_t cols, std::initializer_list<std::pair<Matrix *, int64_t>> parts);
    const float *vector(const std::string &name, int64_t n, bool required = true);
    // An optional vector (F32 of n) llama.cpp loads for the family and its graph never
    // applies: accepted, listed in `unapplied`, and left out as llama.cpp leaves it.
    void unapplied_vector(const std::string &name, int64_t n);
    // An F32 [cols, rows] tensor used as rows × cols floats (convolution filters, a stack
    // of per-expert biases; Mamba-2's per-head [1, heads] and per-group [inner / groups,
    // groups] vectors).
    const float *filters(const std::string &name, int64_t cols, int64_t rows);

    // The tensors of block l that most families name alike: "blk.<l>.attn_norm",
    // attn_q/k/v/output weights with optional q/k/v biases; the FFN's norm (ffn_norm
    // in most families) and the gate/up/down weights of a gated FFN.
    void attention(const HParams &hp, int l, LayerWeights &L);
    void gated_ffn(const HParams &hp, int l, LayerWeights &L, const char *norm = "ffn_norm");
    // The same without their norms; q of q_rows (0: q_dim) rows, which may be one fused
    // attn_qkv with k and v (fused_qkv).
    void attention_weights(const HParams &hp, int l, LayerWeights &L, int64_t q_rows = 0);
    // Block l's attn_qkv (q's q_rows rows, then k's, then v's) as wq, wk and wv, as
    // llama.cpp reads it for every family that binds attention_weights: with its optional
    // fused bias, or else the separate q/k/v biases, which llama.cpp adds only when all
    // three are there (one or two alone are loaded and left out: listed in `unapplied`).
    void fused_qkv(const HParams &hp, int l, LayerWeights &L, int64_t q_rows);
    void ffn_weights(const HParams &hp, int l, LayerWeights &L);
    // The optional biases of block l's gate, up and down projections (Llama, Granite).
    void ffn_biases(const HParams &hp, int l, LayerWeights &L);
    // Block l of the post-norm families (OLMo 2, EXAONE 4: model.h post_norm_rest): the
    // attention's weights with optional q/k/v biases, the query and key norms (q_norm
    // and k_norm floats wide: one head's, or every head's), post_attention_norm, the
    // gated FFN and post_ffw_norm; no norm before either sublayer.
    void post_norm_block(const HParams &hp, int l, LayerWeights &L, int64_t q_norm, int64_t k_norm);
    // The MoE families' metadata: expert counts and widths, and the shared expert's
    // width when the file has one; then, for the families whose files may set them,
    // expert_weights_norm (defaulting to `norm`) and expert_weights_scale. The FFN of
    // block l: its norm (`norm`), the router, the expert stacks and, when the file has
    // one (hp.n_ff_shexp), the shared expert and its gate.
    void moe_hparams(HParams &hp);
    void moe_weighting(HParams &hp, bool norm);
    // expert_gating_func, as llama.cpp numbers it: 1 softmax, 2 sigmoid, 3 softmax over the
    // chosen scores, 4 square root of softplus (the others are refused).
    void moe_gating(HParams &hp, bool required);
    void moe_ffn(const HParams &hp, int l, LayerWeights &L, const char *norm = "ffn_norm");
    // The Qwen3.5 families' metadata: the Gated DeltaNet's dimensions (ssm.*), which
    // layers are DeltaNet layers (attention.recurrent_layers, else every layer but each
    // full_attention_interval-th) and the multi-section RoPE of text positions. And the
    // first half of their block l: attn_norm, then the DeltaNet's tensors in a
    // recurrent layer or the gated attention's (model.h: gated_attention) in the others.
    void delta_net_hparams(HParams &hp);
    // The multi-section RoPE of text positions (rope.dimension_sections: 3 or 4 counts of
    // pairs, into `sections`): the pairs of the fourth section, whose position is 0 for
    // text, stay unturned (HParams::rope_fixed). Pair i lies in sector i % Σsections;
    // interleaved, sector s is in section s % 3 while s < 3 · that section's count
    // (Qwen3.5's), else the sections follow each other (GLM-4.1V's). False if malformed.
    bool rope_sections(HParams &hp, bool interleaved, int sections[4]);
    void delta_net_mixer(const HParams &hp, int l, LayerWeights &L);
    // The LFM2 families' metadata: a layer without key/value heads is a short-convolution
    // block over shortconv.l_cache positions. And the first half of their block l:
    // attn_norm, then the convolution's tensors or Qwen3-style attention's.
    void short_conv_hparams(HParams &hp);
    void short_conv_mixer(const HParams &hp, int l, LayerWeights &L);
    // Their final norm, which they keep in token_embd_norm.weight, into m.output_norm.
    void short_conv_output_norm(Model &m);
    // The Mamba-2 hybrids' metadata (Granite 4.0-H): the SSM's dimensions (ssm.*); a
    // layer without key/value heads is a Mamba-2 layer. And the first half of their
    // block l: attn_norm, then the Mamba-2 tensors, or attention's (optional q/k/v and
    // output biases).
    void mamba2_hparams(HParams &hp);
    void mamba2_mixer(const HParams &hp, int l, LayerWeights &L);
    // The tensors of multi-token-prediction block l that every family names alike
    // (blk.<l>.nextn.*: eh_proj, enorm, hnorm, and the optional embed_tokens,
    // shared_head_head, shared_head_norm); the block's own layer is the family's.
    void nextn(const HParams &hp, int l, NextNWeights &N);
};

struct KVCache; // memory/kvcache.h

// One token of a forward batch.
struct RecurrentState; // recurrent.h

struct BatchToken {
    KVCache *kv;
    int32_t token;
    int32_t pos;   // its position in kv; positions 0..pos-1 must already be there
    bool logits;   // compute next-token logits after this token
    RecurrentState *rs = nullptr; // the session's recurrent layers' state (at pos), if the model has any
};

// One matrix product of a parallel region: y (n, w.rows) = x (n, w.cols) · wᵀ + bias,
// or y += that when `add`. Quantized weights read xq (x quantized per block), others
// read x. With `up`, a gated unit: y = act(x · wᵀ + bias) * (x · upᵀ + up_bias),
// `scratch` (n, up.rows) holding the latter. Layers build jobs with the named helpers
// below and run them with matmuls(), which supplies x and xq.
struct MatJob {
    const Matrix *w;
    const float *x;
    const BlockQ8A *xq;
    float *y;
    bool add = false;
    const float *bias = nullptr;
    const Matrix *up = nullptr;
    const float *up_bias = nullptr;
    float *scratch = nullptr;
    Glu act = Glu::silu; // the gate's activation
    int n = 0;         // tokens of this job when not the region's (an expert's own group)
    // Where a weight has a per-tensor scale (Matrix::scale), llama.cpp scales attention
    // products before their bias, s · (x wᵀ) + b, and FFN products after it,
    // s · (x wᵀ + b): the latter with this set.
    bool scale_bias = false;
};

// Scratch activations, shared by all sessions (one forward runs at a time).
struct Workspace {
    std::vector<float> x, xb, q, k, v, att, hb, hb2, logits_in;
    std::vector<BlockQ8A> q8;           // (n, q_dim / 32) q quantized for quantized keys (attention.h)
    std::vector<float> rope;            // (n, rope_dim): cos and sin of each token's RoPE angles
    std::vector<float> rope_local;      // (n, rope_dim): the same for Model::inv_freq_local
    std::vector<float> att_parts;       // attention: each range's output, or a task's scratch (attention.h)
    std::vector<AttnPartial> att_stats; // their partials, then each running result's
    std::vector<BlockQ8A> xq;
    std::vector<MatJob> jobs;           // the jobs of the running parallel region
    std::vector<float> router;          // (n, n_expert) MoE: routing scores, then probabilities
    std::vector<float> moe_in, moe_h, moe_h2, moe_out, moe_acc; // the grouped rows and their results
    std::vector<float> moe_shared;      // (n, n_ff_shexp) the shared expert's hidden rows
    std::vector<float> moe_route;       // (n, dim) the router's input where not the experts' (SmallThinker, Gemma 4)
    struct ExpertGroup { int expert, row, n; }; // rows [row, row + n) of moe_in are its tokens
    std::vector<ExpertGroup> moe_groups; // the experts any token of the batch was routed to
    std::vector<int> moe_tokens;        // (n · n_expert_used) the token of each grouped row
    std::vector<float> moe_weights;     // (n, n_expert) each token's weight for each expert
    std::vector<BlockQ8A> moe_xq;       // each group's rows quantized on their own
    std::vector<float> recurrent, recurrent_in; // a recurrent block's projections (recurrent.h)
    std::vector<float> sublayer;        // (n, dim) a sublayer's output, scaled (Granite) or normed (Gemma 4's experts')
                                        // before it joins the residual
    std::vector<float> nextn_in;        // (n, 2 · dim) a prediction block's input: normed embeddings and hidden states
    std::vector<float> per_layer;       // (n, n_layer · n_embd_per_layer) Gemma 4's per-layer inputs
    int capacity = 0;
    void reserve(const HParams &hp, int n_tokens);
};

constexpr int kMaxBatch = 256; // tokens per forward pass; longer prefills are chunked

// Runs the tokens through the model, writing their K/V into their caches and,
// for every token with `logits` set, n_vocab logits (in batch order) to `logits`;
// with `hidden`, that token's final-normed hidden state (dim floats, the input
// of the output head, which is then skipped) to `hidden` instead: embeddings. With
// `states`, every token's final-normed hidden state (n, dim) besides: what the
// prediction block reads (forward_nextn).
void forward(const Model &model, const BatchToken *batch, int n, Workspace &ws,
             ThreadPool &pool, float *logits, float *hidden = nullptr, float *states = nullptr);

// Runs the tokens through the model's first multi-token-prediction block (Model::nextn),
// as llama.cpp's Qwen3.5 drafting does: token t's input is eh_proj · [enorm(its
// embedding), hnorm(before[t])], before (n, dim) the final-normed hidden state of the
// position before it (forward's states, or this block's own when drafting on from a
// draft; zeros before position 0); the block writes its K/V as layer n_layer of the
// token's cache. Then its head norm (shared_head_norm, else output_norm): each
// token's output state to `states` (n, dim) if given, and for every token with
// `logits` set, n_vocab logits (in batch order) from its head (shared_head_head, else
// output) to `logits`.
void forward_nextn(const Model &model, const BatchToken *batch, int n, const float *before, Workspace &ws,
                   ThreadPool &pool, float *logits, float *states);

// ---- shared ops: what architectures build their layers from (arch/*.cpp) ----

// One forward pass as every layer sees it: the batch, its activations (in ws) and
// the threads.
struct Pass {
    const Model &model;
    const HParams &hp;
    const BatchToken *batch;
    int n; // tokens in the batch
    Workspace &ws;
    ThreadPool &pool;
    float *x = ws.x.data();     // (n, dim) the residual stream
    float *xb = ws.xb.data();   // (n, dim) a sublayer's normed input
    float *q = ws.q.data();     // (n, n_head * head_dim)
    float *k = ws.k.data();     // (n, n_head_kv * head_dim)
    float *v = ws.v.data();     // (n, n_head_kv * head_dim)
    float *att = ws.att.data(); // (n, n_head * head_dim) attention output
    float *hb = ws.hb.data();   // (n, ff) FFN hidden
    float *hb2 = ws.hb2.data(); // (n, ff) FFN scratch
};

// y = x · wᵀ (+ bias)
MatJob project(const Matrix &w, float *y, const float *bias = nullptr);
// y += x · wᵀ (+ bias): a residual connection written by the matrix product itself.
MatJob residual(const Matrix &w, float *y, const float *bias = nullptr);
// y = silu(x · gateᵀ + gate_bias) * (x · upᵀ + up_bias); scratch (n, up.rows).
MatJob swiglu(const Matrix &gate, const Matrix &up, float *y, float *scratch, const float *gate_bias = nullptr,
              const float *up_bias = nullptr);
// y = gelu(x · gateᵀ) * (x · upᵀ), GELU's tanh approximation; scratch (n, up.rows).
MatJob geglu(const Matrix &gate, const Matrix &up, float *y, float *scratch);
// Runs the jobs, all reading x (n, cols of their weights), as one parallel region.
void matmuls(const Pass &p, const float *x, std::initializer_list<MatJob> jobs);

// out (n) = x / rms(x) * weight, in double precision; out may be x.
void rmsnorm(float *out, const float *x, const float *weight, int n, float eps,
             double (*sum_squares)(const float *x, int n) = kernels().sum_squares);
// out (n, dim) = x / rms(x) * weight, each token's row.
void rmsnorm_rows(const Pass &p, float *out, const float *x, const float *weight);
// out (n) = (x - mean(x)) / √(var(x) + eps) * weight, a LayerNorm without bias; out may be x.
void layernorm(float *out, const float *x, const float *weight, int n, float eps);
// The same for each token's row of x (n, dim).
void layernorm_rows(const Pass &p, float *out, const float *x, const float *weight);
// x (n, dim) += the mixture of experts over xb (n, dim): the router scores each
// token's row of `route` (xb unless given), plus L.router_b where L has it; hp.gating
// turns the scores into probabilities (softmax, or a sigmoid or √softplus each), and
// the token's top n_expert_used experts by probability (plus L.expert_bias where L has
// one: it only chooses) are weighted by their probabilities, renormalised if
// hp.expert_norm and scaled by hp.expert_scale; or (softmax_chosen) the top
// n_expert_used by score (plus bias) are weighted by the softmax of their scores alone,
// then renormalised and scaled alike. Plus the shared expert if L has one,
// weighted by sigmoid(xb · shexp_gate) (by 1 without that gate). Experts are gated
// units of hp.expert_glu (the shared one SwiGLU), with their biases where L has them;
// without gate projections (Nemotron-H's), relu(xb · upᵀ)². Each expert runs once
// over the tokens routed to it, so its weights are read once per batch; each token
// sums its experts in expert order, then the shared one, whatever else is in the batch.
void moe(const Pass &p, const LayerWeights &L, const float *xb, float *x, const float *route = nullptr);
// x[i] = max(x[i], 0)², Nemotron-H's activation.
void relu_squared(float *x, size_t n);
// x (n, dim) += scale · y (n, dim)
void add_rows(const Pass &p, float *x, const float *y, float scale = 1.0f);
// x (n, n_heads * hd): each head of each token RMS-normalised in place and scaled by
// weight (hd); heads of head_dim unless hd is given (a layer's own: HParams::hd).
void rmsnorm_heads(const Pass &p, float *x, int n_heads, const float *weight, int hd = 0);

// How RoPE pairs the dims of a head: adjacent (x[2i], x[2i+1]) as in the original
// Llama, or NEOX halves (x[i], x[i + rope_dim/2]).
enum class Rope { adjacent, neox };
// x (n, n_heads * hd): the leading dims of each head rotated by each token's angles
// (forward() computes them once for all layers): rope_dim of them, or with `local`
// as many as Model::inv_freq_local turns, by its angles. Heads of head_dim unless hd
// is given (a layer's own: HParams::hd).
void rope(const Pass &p, float *x, int n_heads, Rope style, bool local = false, int hd = 0);

// The pre-norm attention input most families share: xb = rmsnorm(x), then
// q, k, v = xb · wq/wk/wvᵀ (+ biases where L has them) in one parallel region.
void project_qkv(const Pass &p, const LayerWeights &L);

// The attention sublayer most families share: project_qkv, RoPE of q and k in
// `style` (by the local angles with `local`), attention, and x += att · woᵀ (+ bo
// where L has it).
void rope_attention(const Pass &p, const LayerWeights &L, int layer, Rope style, bool local = false);

// The attention sublayer of the Qwen3 families: project_qkv, each query and key
// head RMS-normed, NEOX RoPE, attention, and x += att · woᵀ.
void qk_norm_attention(const Pass &p, const LayerWeights &L, int layer);

// The attention sublayer of the Qwen3.5 families: xb = rmsnorm(x); wq gives each head
// its queries and, beside them, a gate; q and k RMS-normed per head, NEOX RoPE (the
// multi-section angles), attention, each head's output times sigmoid(its gate), and
// x += that · woᵀ.
void gated_attention(const Pass &p, const LayerWeights &L, int layer);

// The pre-norm SwiGLU feed-forward sublayer most families share:
// x += down(silu(gate(xb)) * up(xb)) with xb = rmsnorm(x), biases where L has them
// (inside the weights' per-tensor scales, as llama.cpp's FFN adds them).
void swiglu_ffn(const Pass &p, const LayerWeights &L);

// The pre-norm feed-forward sublayer, with experts or without: x += the mixture of
// experts (moe) over xb = rmsnorm(x) by ffn_norm where L has a router, else swiglu_ffn
// (a dense model, or the dense leading layers of a MoE family).
void ffn_sublayer(const Pass &p, const LayerWeights &L);

// The rest of a block of the OLMo 2 and EXAONE 4 families, which norm a sublayer's
// output instead of its input, once q, k and v are in place: x += rmsnorm(att woᵀ) by
// attn_post_norm, att the attention of layer l; then the SwiGLU feed-forward sublayer,
// x += rmsnorm(down(silu(gate(x)) * up(x))) by ffn_post_norm.
void post_norm_rest(const Pass &p, int l, const LayerWeights &L);

// The rest of a block of the Gemma 2, 3 and 4 and GLM-4 families, which norm each
// sublayer's input and output, once q, k and v are in place: sandwich_attention, then
// the gated feed-forward sublayer, x += rmsnorm(down(act(gate(xb)) * up(xb))) by
// ffn_post_norm, with xb = rmsnorm(x) by ffn_norm.
void sandwich_norm_rest(const Pass &p, int l, const LayerWeights &L, Glu act = Glu::gelu);
// Its attention half: x += rmsnorm(att woᵀ) by attn_post_norm, att the attention of layer l.
void sandwich_attention(const Pass &p, int l, const LayerWeights &L);

// Writes this layer's k and v (ws.k, ws.v, (n, kv_dim), of the layer's head width and
// KV heads) into each token's cache, unless it reads an earlier layer's (kv_from),
// then ws.att (n, q_dim) = causal attention of ws.q over the token's session (the
// last hp.window[layer] positions of it for a sliding-window layer), each query head's
// sink logit in its softmax where the layer has attn_sinks (attention.h: attend_sink).
// A quantized cache's rotation (attention.h: kv_rotation) rotates ws.q in place, and
// its keys meet it quantized into ws.q8.
void attend(const Pass &p, int layer);
} // namespace llmd
