// kernels.h — the kernel tables: every function whose fast form depends on the CPU's
// instruction set, gathered into one table per variant, and the choice of the table
// the engine runs.
//
// A variant is one or more translation units built with their own compiler flags
// (build_native.py): kernels/x86/ (avx2, avx-vnni, avx512) on x86-64, kernels/arm/
// (neon, dotprod, i8mm) on arm64. The rest of the engine is built for the ISA's baseline and calls through
// kernels(), so one build runs on every CPU of its ISA and nothing outside kernels/
// knows which variant runs. The scalar variant holds the references (the test oracle):
// every entry of every variant is checked against them by tests/test_kernels.py
// through the llmd_kernel_* entry points, which name the variant to run, and by
// native/tests/kernel_test.cpp without Python (which .ci/arm64 runs under qemu).
//
// Within a variant, results are batch-invariant: a token's numbers never depend on
// what else shares its batch, its chunk or its thread split. Across variants they may
// differ in the last bits (another accumulation order).
//
// A variant's sources include only intrinsics headers, <cstdint>/<cstring>/<cmath>/
// <algorithm> (inline, and fully inlined at -O3) and the engine's headers of plain
// data and declarations; their own helpers live in an anonymous namespace. Any inline
// function they emit out of line could otherwise be merged by the linker with the
// baseline build's copy, and run on a CPU without the variant's instructions.
#pragma once

#include "ops/attention.h"
#include "quants/quants.h"

#include <cstdint>
#include <string>

namespace llmd {

using AttendFn = void (*)(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd,
                          KVTypes types, AttnScale score, float *out, AttnPartial *part, bool cold);
// A run of tokens through one Gated DeltaNet head (ops/recurrent.h: delta_scan):
// token t reads q, k and v (hd each) at + t · stride, its decay and beta at
// [t · gate_stride], and writes its output (hd) at out + t · out_stride.
struct DeltaTokens {
    const float *q, *k, *v;
    size_t stride;
    const float *decay, *beta;
    size_t gate_stride;
    float *out;
    size_t out_stride;
};
// A run of tokens of one session through one Mamba-2 head (ops/recurrent.h: ssm_scan):
// token t reads x (head_dim) at x + t · stride, B and C (d_state each) at b + t · stride
// and c + t · stride, its step (dt after softplus) and decay (exp(dt · A)) at
// dt[t · dt_stride] and decay[t · dt_stride], and writes y (head_dim) at y + t · y_stride.
struct SsmTokens {
    const float *x, *b, *c;
    size_t stride;
    const float *dt, *decay;
    size_t dt_stride;
    float *y;
    size_t y_stride;
};
using FoldFn = void (*)(float *y, AttnPartial *acc, const float *out, const AttnPartial *part, int n_q, int hd);
using DeltaScanFn = void (*)(float *m, const DeltaTokens &x, int n, int hd, float scale);
using SsmScanFn = void (*)(float *s, const SsmTokens &x, int n, int head_dim, int d_state);

struct Kernels {
    const char *name; // "scalar", "avx2", "avx-vnni", "avx512", "neon", "dotprod", "i8mm"
    // A row against n elements of x (F32-activation types) or their Q8A/Q8K blocks,
    // indexed by GGUF type; nullptr where the engine has no kernels for the type.
    DotFn dot[kTypeCount];
    // The tiled kernel over a type's packed panels (quants.h: PanelLayout), or nullptr:
    // the variant keeps that type's rows as the file has them and uses dot.
    PanelFn panel[kTypeCount];
    // Activations into BlockQ8A blocks (quants.h: quantize_rows), the same bits in
    // every variant.
    void (*quantize_q8a)(const float *x, BlockQ8A *y, int64_t n, int64_t group);
    AttendFn attend_range;    // ops/attention.h
    FoldFn attend_fold;       // ops/attention.h; the same bits in every variant (kernels/fold.h)
    DeltaScanFn delta_scan;   // ops/recurrent.h
    SsmScanFn ssm_scan;       // ops/recurrent.h
    // gate[i] = act(gate[i]) * up[i], act SiLU or GELU (tanh approximation); act(gate[i])
    // alone when up is nullptr.
    void (*glu)(bool gelu, float *gate, const float *up, int64_t n);
    // Σ x[i]² in double, for rmsnorm.
    double (*sum_squares)(const float *x, int n);
    // A key or value of n floats as a row of KV type `type` (attention.h: KVTypes),
    // the cache's writes: F16 bits rounded to nearest even, Q8_0 blocks by the GGUF
    // reference quantizer, Q4_0 blocks by the cache's own fit (quantize.h:
    // quantize_row_q4_0_kv). The same bytes in every variant.
    void (*kv_row)(uint32_t type, const float *x, uint8_t *y, int n);
};

// A variant's panel kernels into its table: Panel<L>::matmul for the layout L of every
// type the traits table (quants.h) gives one. A kernel instantiated for another
// layout than the one its type is packed with fails the tests against the references.
template <template <const PanelLayout &> class Panel> void set_panels(Kernels &k) {
    k.panel[GGML_Q4_0] = Panel<kPanelQ4_0>::matmul;
    k.panel[GGML_Q4_1] = Panel<kPanelQ4_1>::matmul;
    k.panel[GGML_Q5_0] = Panel<kPanelQ5_0>::matmul;
    k.panel[GGML_Q5_1] = Panel<kPanelQ5_1>::matmul;
    k.panel[GGML_Q8_0] = Panel<kPanelQ8_0>::matmul;
    k.panel[GGML_IQ4_NL] = Panel<kPanelIQ4NL>::matmul;
    k.panel[GGML_MXFP4] = Panel<kPanelMXFP4>::matmul;
    k.panel[GGML_Q2_K] = Panel<kPanelQ2_K>::matmul;
    k.panel[GGML_Q3_K] = Panel<kPanelQ3_K>::matmul;
    k.panel[GGML_Q4_K] = Panel<kPanelQ4_K>::matmul;
    k.panel[GGML_Q5_K] = Panel<kPanelQ5_K>::matmul;
    k.panel[GGML_Q6_K] = Panel<kPanelQ6_K>::matmul;
    k.panel[GGML_IQ4_XS] = Panel<kPanelIQ4XS>::matmul;
}

// The references, which the scalar table holds and the variants fall back on for
// shapes their fast forms do not take.
void quantize_q8a_ref(const float *x, BlockQ8A *y, int64_t n, int64_t group);
void glu_ref(bool gelu, float *gate, const float *up, int64_t n);
double sum_squares_ref(const float *x, int n);
void to_f16_ref(const float *x, uint16_t *y, int n);
void kv_row_ref(uint32_t type, const float *x, uint8_t *y, int n);
void delta_scan_ref(float *m, const DeltaTokens &x, int n, int hd, float scale); // ops/recurrent.cpp
void ssm_scan_ref(float *s, const SsmTokens &x, int n, int head_dim, int d_state); // ops/recurrent.cpp

// The table of each variant this build has (kernels/*/), the scalar one first; a
// variant is listed whether or not this CPU can run it.
struct KernelVariant {
    const char *name;
    bool (*cpu_runs)();        // does this CPU have the variant's instructions?
    const Kernels &(*table)();
};
int kernel_variant_count();
const KernelVariant &kernel_variant(int i);

// The variant named `name` if this build has it and the CPU runs it, else nullptr
// and the reason in `error`.
const Kernels *kernels_named(const char *name, std::string &error);

// The table in use: LLMD_KERNELS's variant when set, else the fastest this CPU runs;
// fixed the first time it is asked for. choose_kernels reports whether LLMD_KERNELS
// names a variant this build has and this CPU runs (an engine refuses to open when
// not), kernels() itself then runs the fastest.
bool choose_kernels(std::string &error);
const Kernels &kernels();

// Each variant's table (kernels/scalar.cpp, kernels/x86/*.cpp, kernels/arm/*.cpp).
const Kernels &kernels_scalar();
#if defined(__x86_64__)
const Kernels &kernels_avx2();
const Kernels &kernels_avx_vnni();
const Kernels &kernels_avx512();
// Whether the x86 kernels' software prefetches of the weights they stream ask for the L2
// alone rather than every level: true on Intel's CPUs (kernels/x86/prefetch.h). From
// CPUID's vendor, read once.
bool prefetch_to_l2();
#elif defined(__aarch64__)
const Kernels &kernels_neon();
const Kernels &kernels_dotprod();
const Kernels &kernels_i8mm();
#endif

} // namespace llmd
