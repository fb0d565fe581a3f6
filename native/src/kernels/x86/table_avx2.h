// table_avx2.h — the table of the two 256-bit variants, avx2 and avx-vnni: the same
// sources, built with and without the VEX-coded VNNI instructions (build_native.py).
#pragma once

#include "kernels/kernels.h"
#include "kernels/x86/panels_avx2.h"
#include "kernels/x86/rows_avx2.h"

namespace llmd {
namespace {

Kernels table_256(const char *name) {
    Kernels k = kernels_scalar();
    k.name = name;
    set_row_dots(k);
    set_panels<PanelsAvx2>(k);
    return k;
}

} // namespace
} // namespace llmd
