// table_arm.h — the table of the arm64 variants: the same sources for neon, dotprod
// and i8mm, built with each one's instructions (build_native.py); simd_arm.h and
// panels_arm.h pick the dot-product instructions the build has.
#pragma once

#include "kernels/arm/attention_arm.h"
#include "kernels/arm/ops_arm.h"
#include "kernels/arm/rows_arm.h"
#include "kernels/kernels.h"

#if defined(__ARM_FEATURE_DOTPROD)
#include "kernels/arm/panels_arm.h"
#endif

namespace llmd {
namespace {

Kernels table_arm(const char *name) {
    Kernels k = kernels_scalar();
    k.name = name;
    set_row_dots(k);
    // Without dot-product instructions a panel's 16 rows cost as many widening
    // multiplies and pairwise adds as their row dots: neon keeps the rows.
#if defined(__ARM_FEATURE_DOTPROD)
    set_panels<PanelsArm>(k);
#endif
    k.quantize_q8a = quantize_q8a_neon;
    k.attend_range = attend_range_neon;
    k.delta_scan = delta_scan_neon;
    k.glu = glu_neon;
    k.sum_squares = sum_squares_neon;
    k.kv_row = kv_row_neon;
    return k;
}

} // namespace
} // namespace llmd
