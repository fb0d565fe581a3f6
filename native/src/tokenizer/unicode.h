// unicode.h - the little Unicode the tokenizer needs: UTF-8 decoding that never
// fails, code point classes for the pre-tokenizer regexes, and the GPT-2
// byte <-> code point mapping of byte-level BPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace llmd {

// Class bits of a code point (values fixed by gen_unicode_tables.py).
enum CptFlag : uint8_t {
    CPT_LETTER = 0x01,  // \p{L}
    CPT_NUMBER = 0x02,  // \p{N}
    CPT_MARK   = 0x04,  // \p{M}
    CPT_PUNCT  = 0x08,  // \p{P}
    CPT_SYMBOL = 0x10,  // \p{S}
    CPT_SEPAR  = 0x20,  // \p{Z}
    CPT_OTHER  = 0x40,  // \p{C} (assigned)
    CPT_SPACE  = 0x80,  // \s: Unicode White_Space
};

// Stands for one byte that is not part of a valid UTF-8 sequence. Its flags are
// 0, like an unassigned code point: the regexes see it as [^\s\p{L}\p{N}].
constexpr uint32_t CPT_INVALID = 0xFFFFFFFFu;

struct Utf8Char {
    uint32_t cpt;  // code point, or CPT_INVALID
    uint32_t len;  // bytes consumed: 1..4, always 1 for CPT_INVALID
};

// Decodes the character at s[0]; n >= 1 is the number of bytes available.
// Strict RFC 3629: overlong forms, surrogates and values past U+10FFFF are
// invalid, and so is a truncated sequence; each such byte stands alone, so a
// caller walking the text keeps every original byte.
Utf8Char utf8_decode(const char *s, size_t n);

// Appends the UTF-8 encoding of a valid code point.
void utf8_append(std::string &out, uint32_t cpt);

// Class bits of a code point; 0 for unassigned code points and CPT_INVALID.
uint8_t cpt_flags(uint32_t cpt);

// GPT-2 byte-level mapping: every byte value gets a printable code point
// (the byte itself when printable, else 256 + n), so a vocabulary of text
// tokens can spell any byte string.
uint32_t byte_to_cpt(uint8_t byte);
int byte_from_cpt(uint32_t cpt);  // the byte, or -1 if cpt is not in the mapping

}  // namespace llmd
