// avx512.cpp — the avx512 variant: AVX-512 F, BW, VL and VNNI (Intel since Ice Lake
// and Cascade Lake, AMD since Zen 4). Repacked panels for every quantized type.
#include "kernels/fold.h"
#include "kernels/kernels.h"
#include "kernels/x86/attention_avx512.h"
#include "kernels/x86/kv_avx2.h"
#include "kernels/x86/ops_avx512.h"
#include "kernels/x86/panels_avx512.h"
#include "kernels/x86/rows_avx2.h"

namespace llmd {

const Kernels &kernels_avx512() {
    static const Kernels k = [] {
        Kernels t = kernels_scalar();
        t.name = "avx512";
        set_row_dots(t);
        set_panels<PanelsAvx512>(t);
        t.quantize_q8a = quantize_q8a_avx512;
        t.attend_range = attend_range_avx512;
        t.attend_fold = fold_partial;
        t.delta_scan = delta_scan_avx512;
        t.ssm_scan = ssm_scan_avx512;
        t.glu = glu_avx512;
        t.sum_squares = sum_squares_avx512;
        t.kv_row = kv_row_x86;
        return t;
    }();
    return k;
}

} // namespace llmd
