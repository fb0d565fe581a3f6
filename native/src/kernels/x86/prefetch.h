// prefetch.h — how the x86 kernels ask for the weights they stream, ahead of their use.
#pragma once

#include "kernels/kernels.h"

#include <cstddef>
#include <cstdint>
#include <immintrin.h>

namespace llmd {
namespace {

// Where the prefetches put the lines. On AMD's cores into every level (PREFETCHT0), with
// which they were tuned on the Zen 4 EPYC (kPanelPrefetch in panels_avx512.h; PREFETCHT1
// was not tried there). On Intel's into the L2 alone (PREFETCHT1): a line asked for into
// the L1 holds one of its few fill buffers until it arrives, which capped one core of an
// Intel Xeon VM (family 6 model 167) at 10-11 GB/s through the 1B shape's matrices for
// one token; asked for into the L2 they streamed 12.3-14 GB/s, as fast as its loop of
// plain loads (13.2), and the 1B shape's Q4_K_M decoded 13-30 % faster (2 threads:
// avx512 29.2 → 32.9 tok/s, avx2 25.7 → 31.6, avx-vnni 24.8 → 32.2). Matrices whose
// panels stay in the L3 ran as before.
const bool stream_into_l2 = prefetch_to_l2();

// Asks for the cache lines of [p, p + bytes). Always inlined: a call of it left out of
// line (GCC 12, in the kernels' large translation units) was judged free of effects,
// prefetches being no stores, and dropped with every prefetch in it.
__attribute__((always_inline)) inline void prefetch_weights(const uint8_t *p, size_t bytes) {
    if (stream_into_l2)
        for (size_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char *>(p + at), _MM_HINT_T1);
    else
        for (size_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char *>(p + at), _MM_HINT_T0);
}

} // namespace
} // namespace llmd
