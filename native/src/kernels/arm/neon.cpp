// neon.cpp — the neon variant: the armv8-a baseline, Advanced SIMD without the dot
// product instructions (every arm64 CPU, e.g. the Cortex-A72 of a Raspberry Pi 4).
#include "kernels/arm/table_arm.h"

namespace llmd {

const Kernels &kernels_neon() {
    static const Kernels k = table_arm("neon");
    return k;
}

} // namespace llmd
