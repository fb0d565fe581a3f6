// pack.cpp — repacking GGUF matrices into panels (quants.h) for the
// kernels of the variants that have them, from each type's piece decoder.
#include "quants/quants.h"

#include "kernels/kernels.h"

#include <cstring>

namespace llmd {

size_t packed_bytes(uint32_t type, int64_t rows, int64_t cols) {
    const TypeTraits *t = type_traits(type);
    if (t == nullptr || kernels().panel[type] == nullptr || rows < 1 || !type_runs(type, cols)) return 0;
    return static_cast<size_t>((rows + kPanel - 1) / kPanel) * panel_bytes(t->panel, cols / QK);
}

namespace {

// The byte a weight is stored as: its code in the layout's table, or q + offset.
uint8_t stored_weight(const PanelLayout &l, int8_t q) {
    if (l.lut == nullptr) return static_cast<uint8_t>(q + l.offset);
    uint8_t code = 0;
    while (code < 15 && l.lut[code] != q) ++code;
    return code;
}

// Row i's entry of a set of 16 floats: f16 (exact: such layouts hold values the
// file stores as f16) or f32.
void store_float(bool f16, uint8_t *set, int i, float v) {
    if (f16) {
        const uint16_t h = fp32_to_fp16(v);
        std::memcpy(set + 2 * i, &h, 2);
    } else {
        std::memcpy(set + 4 * i, &v, 4);
    }
}

} // namespace

void pack_rows(uint32_t type, const void *w, int64_t rows, int64_t cols, uint8_t *out) {
    const TypeTraits &t = *type_traits(type);
    const PanelLayout &l = t.panel;
    const int64_t nb = cols / QK, panels = (rows + kPanel - 1) / kPanel;
    const size_t pbytes = panel_bytes(l, nb), weights = panel_weight_bytes(l);
    const int low = panel_low_bits(l);
    const size_t set = kPanel * (l.k_scales ? 1 : l.f16 ? 2 : 4); // one set of 16 scales or mins
    const int sets = l.split ? 2 : 1;
    const size_t src_row = row_bytes(type, cols);
    std::memset(out, 0, static_cast<size_t>(panels) * pbytes);
    Piece p;
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *row = static_cast<const uint8_t *>(w) + static_cast<size_t>(r) * src_row;
        uint8_t *panel = out + static_cast<size_t>(r / kPanel) * pbytes;
        const int i = static_cast<int>(r % kPanel);
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *blk = panel + panel_piece_offset(l, b);
            t.decode(row, b, &p);
            for (int e = 0; e < QK; ++e) { // into w[g]'s byte at: planes as PanelLayout lays them out
                const uint8_t u = stored_weight(l, p.q[e]);
                const int g = e / 4, at = i * 4 + e % 4;
                if (low == 8) blk[g * 64 + at] = u;
                else if (low == 4) blk[g % 4 * 64 + at] |= static_cast<uint8_t>((u & 15) << 4 * (g / 4));
                else blk[g / 4 * 64 + at] |= static_cast<uint8_t>((u & 3) << 2 * (g % 4));
                uint8_t *high = blk + 64 * low;
                const uint8_t rest = static_cast<uint8_t>(u >> low);
                if (l.bits - low == 2) high[g / 4 * 64 + at] |= static_cast<uint8_t>(rest << 2 * (g % 4));
                else if (l.bits - low == 1) high[at] |= static_cast<uint8_t>(rest << g);
            }
            uint8_t *scales = blk + weights, *mins = scales + sets * set;
            for (int h = 0; h < sets; ++h) {
                if (l.k_scales) { // the integers; d and m once per 256 elements
                    scales[h * set + i] = static_cast<uint8_t>(static_cast<int8_t>(p.scale[h]));
                    if (l.mins) mins[h * set + i] = static_cast<uint8_t>(static_cast<int8_t>(p.mscale[h]));
                } else {
                    store_float(l.f16, scales + h * set, i, p.d * static_cast<float>(p.scale[h]));
                    if (l.mins) store_float(l.f16, mins + h * set, i, p.min(h));
                }
            }
            if (l.k_scales && b % 8 == 0) {
                uint8_t *header = blk - panel_header_bytes(l);
                store_float(true, header, i, p.d);
                if (l.mins) store_float(true, header + 2 * kPanel, i, p.m);
            }
        }
    }
}

void matmul_packed(uint32_t type, const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0, int64_t p1,
                   const BlockQ8A *xq, int n, float *y, int64_t y_stride, bool add) {
    kernels().panel[type](packed, rows, cols, p0, p1, xq, n, y, y_stride, add);
}

} // namespace llmd
