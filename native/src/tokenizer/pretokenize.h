// pretokenize.h - the split of text into the words BPE runs on, as the
// GGUF's tokenizer.ggml.pre names it.
//
// Theory of operation. Each pre-tokenizer is one row of a table: the names
// llama.cpp accepts for it, a few options, and its regex passes in the order
// llama.cpp applies them. A pass splits every word the previous passes made
// into its matches and the stretches between them (both become words). The
// patterns that do most of the work (GPT-2, Llama 3, Qwen 2/3.5, lone digits,
// newline runs) have hand-written splitters, as llama.cpp has; every other
// pattern runs through regex.h. So a new pre-tokenizer is a new row.
#pragma once

#include "tokenizer/regex.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmd {

// How the hand-written splitters see a character (combining marks count as
// other). PRE_END stands for "past the end of the word": lookaheads like
// \s+(?!\S) stop at word boundaries.
enum PreKind : uint8_t { PRE_END, PRE_LETTER, PRE_NUMBER, PRE_SPACE, PRE_OTHER };

// One character of the text being split.
struct PreUnit {
    size_t off;     // byte offset of the character in the text
    uint32_t cpt;   // code point, or CPT_INVALID for a byte that is not UTF-8
    uint8_t flags;  // cpt_flags(); an invalid byte has those of U+FFFD, as llama.cpp sees it
    PreKind kind;   // from flags
};

// The characters of text (every byte lands in exactly one unit). Returns
// whether any byte is not UTF-8.
bool pre_units(std::string_view text, std::vector<PreUnit> &out);

enum PreOption : uint8_t {
    PRE_IGNORE_MERGES = 1,  // a word that is a whole token is that token, without BPE
    PRE_ADD_BOS = 2,        // prompts start with BOS unless the file says otherwise
    PRE_NO_BOS = 4,         // there is no default BOS id
    PRE_RAW_UTF8 = 8,       // SentencePiece-style BPE: spaces become U+2581, symbols are
                            // UTF-8 characters, unknown bytes fall back to <0xXX> tokens
};

class PreTokenizer {
public:
    // The pre-tokenizer named `name`, or nullptr with *error naming it and
    // listing the supported names.
    static std::unique_ptr<PreTokenizer> create(std::string_view name, std::string *error);

    // Sets ends to the end (a unit index) of each word of units, in order.
    void split(const std::vector<PreUnit> &units, std::vector<size_t> &ends) const;

    uint8_t options() const { return options_; }

    ~PreTokenizer();

private:
    struct Pass;
    PreTokenizer() = default;

    uint8_t options_ = 0;
    std::vector<Pass> passes_;
};

}  // namespace llmd
