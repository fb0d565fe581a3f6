// i8mm.cpp — the i8mm variant: dotprod's sources with the mixed-sign USDOT and
// USMMLA (two rows by two tokens by 8 elements an instruction), which take the
// panels' unsigned weights as they are stored (Graviton 3 and later, Apple M2 and
// later).
#include "kernels/arm/table_arm.h"

namespace llmd {

const Kernels &kernels_i8mm() {
    static const Kernels k = table_arm("i8mm");
    return k;
}

} // namespace llmd
