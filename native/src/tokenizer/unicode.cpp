#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace llmd {

namespace {

struct CptRange {
    uint32_t first;
    uint32_t last;
    uint8_t flags;
};

// Sorted, non-overlapping; code points in no range have flags 0.
const CptRange k_ranges[] = {
#include "tokenizer/unicode_tables.inc"
};

uint8_t lookup_flags(uint32_t cpt) {
    const auto *end = std::end(k_ranges);
    const auto *it = std::upper_bound(std::begin(k_ranges), end, cpt,
                                      [](uint32_t c, const CptRange &r) { return c < r.first; });
    if (it == std::begin(k_ranges)) {
        return 0;
    }
    --it;
    return cpt <= it->last ? it->flags : 0;
}

// ASCII is most of the text we see; skip the binary search for it.
const std::array<uint8_t, 128> &ascii_flags() {
    static const std::array<uint8_t, 128> table = [] {
        std::array<uint8_t, 128> t{};
        for (uint32_t c = 0; c < 128; ++c) {
            t[c] = lookup_flags(c);
        }
        return t;
    }();
    return table;
}

// The bytes GPT-2 leaves as themselves: printable Latin-1 except the soft hyphen.
bool byte_is_printable(uint32_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteMap {
    std::array<uint32_t, 256> to_cpt;   // byte -> code point
    std::array<int16_t, 256 + 68> from; // code point (< 324) -> byte, or -1
};

const ByteMap &byte_map() {
    static const ByteMap map = [] {
        ByteMap m{};
        m.from.fill(-1);
        uint32_t next = 256;  // the 68 non-printable bytes take 256.. in byte order
        for (uint32_t b = 0; b < 256; ++b) {
            m.to_cpt[b] = byte_is_printable(b) ? b : next++;
            m.from[m.to_cpt[b]] = static_cast<int16_t>(b);
        }
        return m;
    }();
    return map;
}

}  // namespace

Utf8Char utf8_decode(const char *s, size_t n) {
    const auto *u = reinterpret_cast<const unsigned char *>(s);
    const uint32_t b0 = u[0];
    if (b0 < 0x80) {
        return {b0, 1};
    }
    const Utf8Char bad = {CPT_INVALID, 1};
    uint32_t len, cpt, min;
    if ((b0 & 0xE0) == 0xC0) {
        len = 2, cpt = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
        len = 3, cpt = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
        len = 4, cpt = b0 & 0x07, min = 0x10000;
    } else {
        return bad;  // a continuation byte or 0xF8..0xFF cannot start a character
    }
    if (n < len) {
        return bad;
    }
    for (uint32_t i = 1; i < len; ++i) {
        if ((u[i] & 0xC0) != 0x80) {
            return bad;
        }
        cpt = (cpt << 6) | (u[i] & 0x3F);
    }
    if (cpt < min || cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) {
        return bad;
    }
    return {cpt, len};
}

void utf8_append(std::string &out, uint32_t cpt) {
    if (cpt < 0x80) {
        out += static_cast<char>(cpt);
    } else if (cpt < 0x800) {
        out += static_cast<char>(0xC0 | (cpt >> 6));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
        out += static_cast<char>(0xE0 | (cpt >> 12));
        out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cpt >> 18));
        out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    }
}

uint8_t cpt_flags(uint32_t cpt) {
    if (cpt < 128) {
        return ascii_flags()[cpt];
    }
    return cpt == CPT_INVALID ? 0 : lookup_flags(cpt);
}

uint32_t byte_to_cpt(uint8_t byte) {
    return byte_map().to_cpt[byte];
}

int byte_from_cpt(uint32_t cpt) {
    const auto &from = byte_map().from;
    return cpt < from.size() ? from[cpt] : -1;
}

}  // namespace llmd
