// dotprod.cpp — the dotprod variant: armv8.2-a with SDOT/UDOT (the Cortex-A76 of a
// Raspberry Pi 5, Graviton 2 and later, Apple M1 and later). Repacked panels for
// every quantized type.
#include "kernels/arm/table_arm.h"

namespace llmd {

const Kernels &kernels_dotprod() {
    static const Kernels k = table_arm("dotprod");
    return k;
}

} // namespace llmd
