// avx2.cpp — the avx2 variant: AVX2, FMA and F16C (Intel since Haswell, AMD since
// Excavator and every Zen).
#include "kernels/x86/table_avx2.h"

namespace llmd {

const Kernels &kernels_avx2() {
    static const Kernels k = table_256("avx2");
    return k;
}

} // namespace llmd
