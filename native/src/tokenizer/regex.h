// regex.h - the small regular expressions that pre-tokenizers are written in,
// matched the way llama.cpp matches them.
//
// Theory of operation. llama.cpp runs the pre-tokenizer regexes it has no
// hand-written splitter for through std::regex (ECMAScript: backtracking,
// leftmost alternative first), on a "view" of the text rather than the text:
//   - collapsed view, for a pattern that names a Unicode category (\p{L}, ...):
//     ASCII stays itself; any other code point becomes one placeholder per
//     class: 0x0B whitespace, 0xD1 number, 0xD2 letter, 0xD3 punctuation,
//     0xD4 mark, 0xD5 symbol, 0xD0 anything else. \p{X} then means the
//     placeholder plus the ASCII members of X (\p{Lu}, \p{Ll}, ... all mean
//     letter), so case is only seen in ASCII;
//   - wide view, for a pattern without categories: code points themselves,
//     except non-ASCII whitespace, which becomes 0x0B.
// \s is ASCII whitespace (so also the 0x0B placeholder). This file compiles a
// pattern into a program for a backtracking machine with an explicit stack
// (no recursion, so a long run of spaces cannot overflow the C++ stack) and
// runs it over a view with the same semantics. It supports what pre-tokenizer
// patterns use: alternation, (), (?:), (?=), (?!), classes with ranges and
// negation, \s \S \d \p{..}, ? * + {n} {n,} {n,m} (greedy), and $.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmd {

// Placeholders of the collapsed view.
enum : uint32_t {
    VIEW_SPACE = 0x0B,
    VIEW_OTHER = 0xD0,
    VIEW_NUMBER = 0xD1,
    VIEW_LETTER = 0xD2,
    VIEW_PUNCT = 0xD3,
    VIEW_MARK = 0xD4,
    VIEW_SYMBOL = 0xD5,
};

class Regex {
public:
    // nullptr and *error set if the pattern uses something outside the subset.
    static std::unique_ptr<Regex> compile(std::string_view pattern, std::string *error);

    // Which view the pattern is matched against (see the theory above).
    bool collapsed() const { return collapsed_; }

    // Matches at view[start] within view[0, n): the end of the match, or
    // SIZE_MAX if there is none. `stack` is scratch kept between calls.
    size_t match_at(const uint32_t *view, size_t n, size_t start, std::vector<uint64_t> &stack) const;

    Regex(const Regex &) = delete;
    Regex &operator=(const Regex &) = delete;
    ~Regex();

    struct Node;  // parse tree, only while compiling

private:
    enum Op : uint8_t { OP_CLASS, OP_SPLIT, OP_JMP, OP_END, OP_LOOK, OP_MATCH };
    struct Inst {
        Op op;
        bool negate;  // OP_LOOK: (?!...)
        int32_t a;    // OP_CLASS: class; OP_SPLIT/OP_JMP: target (preferred); OP_LOOK: sub-program
        int32_t b;    // OP_SPLIT: the other target; OP_LOOK: where to go on success
    };
    struct Class {
        std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive, on view values
        bool negate = false;
        bool has(uint32_t v) const;
    };

    Regex() = default;
    void emit(const Node &node);
    bool run(int32_t pc, const uint32_t *view, size_t n, size_t start, size_t *end,
             std::vector<uint64_t> &stack) const;

    bool collapsed_ = false;
    std::vector<Inst> prog_;
    std::vector<Class> classes_;
};

}  // namespace llmd
