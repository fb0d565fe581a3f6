// avx_vnni.cpp — the avx-vnni variant: the avx2 sources with 256-bit vpdpbusd (Intel
// since Alder Lake, AMD Zen 5).
#include "kernels/x86/table_avx2.h"

namespace llmd {

const Kernels &kernels_avx_vnni() {
    static const Kernels k = table_256("avx-vnni");
    return k;
}

} // namespace llmd
