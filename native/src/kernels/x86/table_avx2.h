// table_avx2.h — the table of the two 256-bit variants, avx2 and avx-vnni: the same
// sources, built with and without the VEX-coded VNNI instructions (build_native.py).
#pragma once

#include "kernels/fold.h"
#include "kernels/kernels.h"
#include "kernels/x86/attention_avx2.h"
#include "kernels/x86/kv_avx2.h"
#include "kernels/x86/ops_avx2.h"
#include "kernels/x86/panels_avx2.h"
#include "kernels/x86/rows_avx2.h"

namespace llmd {
namespace {

Kernels table_256(const char *name) {
    Kernels k = kernels_scalar();
    k.name = name;
    set_row_dots(k);
    set_panels<PanelsAvx2>(k);
    k.quantize_q8a = quantize_q8a_avx2;
    k.attend_range = attend_range_avx2;
    k.attend_fold = fold_partial;
    k.delta_scan = delta_scan_avx2;
    k.ssm_scan = ssm_scan_avx2;
    k.glu = glu_avx2;
    k.sum_squares = sum_squares_avx2;
    k.kv_row = kv_row_x86;
    return k;
}

} // namespace
} // namespace llmd
