// vocab.h - the tokenizer: byte-level BPE (tokenizer.ggml.model = "gpt2") with
// the pre-tokenizer split named by tokenizer.ggml.pre.
//
// Theory of operation. tokenize() runs three stages:
//   1. special tokens: with parse_special, the text of every control, unknown
//      and user-defined token is cut out of the input and emitted as its id
//      (longer tokens first, as llama.cpp does); without it, the whole input
//      is plain text, so "<|im_end|>" typed by a user stays text;
//   2. pre-tokenizer: each plain-text span is split into words by a hand-written
//      matcher for the regex of `pre` (no std::regex: slow, no Unicode classes);
//   3. BPE: each word starts as one symbol per byte (the token of the byte's
//      GPT-2 code point) and adjacent pairs are merged lowest rank first.
// Every input byte lands in exactly one token, so invalid UTF-8 round-trips:
// concatenating piece(id) over the output gives back the input.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llmd {

// tokenizer.ggml.token_type values.
enum TokenType : int32_t {
    TOKEN_UNDEFINED    = 0,  // treated as normal
    TOKEN_NORMAL       = 1,
    TOKEN_UNKNOWN      = 2,
    TOKEN_CONTROL      = 3,
    TOKEN_USER_DEFINED = 4,
    TOKEN_UNUSED       = 5,
    TOKEN_BYTE         = 6,
};

// The tokenizer as the GGUF metadata spells it.
struct VocabData {
    std::vector<std::string> tokens;  // tokenizer.ggml.tokens (GPT-2 byte-mapped text)
    std::vector<int32_t> types;       // tokenizer.ggml.token_type; empty = all normal
    std::vector<std::string> merges;  // tokenizer.ggml.merges, "left right", rank = index
    std::string model;                // tokenizer.ggml.model: "gpt2"
    std::string pre;                  // tokenizer.ggml.pre: "smollm", "gpt2", "llama-bpe", "default" or ""
};

class Vocab {
public:
    // Validates `data` and builds the lookup tables. On failure returns nullptr
    // and sets *error (if error is not null). Never throws.
    static std::unique_ptr<Vocab> create(VocabData data, std::string *error);

    // Appends the ids of `text` to `out` (no BOS). Thread-safe (const, no shared
    // scratch). Returns false if memory runs out or text is 2 GiB or more;
    // `out` is then left as it was.
    bool tokenize(std::string_view text, bool parse_special, std::vector<int32_t> &out) const;

    // The token's raw bytes (may be part of a UTF-8 character). Control, unknown
    // and user-defined tokens give their text. Empty for an out-of-range id.
    std::string_view piece(int32_t id) const;

    bool is_control(int32_t id) const;
    int32_t type(int32_t id) const;  // TokenType; TOKEN_UNDEFINED for an out-of-range id
    int32_t size() const { return static_cast<int32_t>(tokens_.size()); }

    // The id of the token whose GGUF text is token_text, or -1.
    int32_t find(std::string_view token_text) const;

    Vocab(const Vocab &) = delete;
    Vocab &operator=(const Vocab &) = delete;

private:
    enum class Pre { Gpt2, Smollm, Llama3 };
    struct Merge {
        int32_t rank;
        int32_t id;  // token of the merged pair
    };
    struct Scratch;

    Vocab() = default;
    bool build(VocabData &data, std::string *error);
    void tokenize_text(std::string_view text, Scratch &s, std::vector<int32_t> &out) const;
    void tokenize_word(std::string_view word, Scratch &s, std::vector<int32_t> &out) const;

    Pre pre_ = Pre::Gpt2;
    bool ignore_merges_ = false;  // llama-bpe: a word that is a whole token skips BPE
    std::vector<std::string> tokens_;
    std::vector<int32_t> types_;
    std::vector<std::string> pieces_;                       // raw bytes per id
    std::unordered_map<std::string_view, int32_t> by_text_; // views into tokens_
    std::unordered_map<uint64_t, Merge> merges_;            // (left id << 32 | right id) -> merge
    int32_t byte_token_[256] = {};                          // token of each byte, or -1
    std::vector<int32_t> specials_;                         // longest text first
};

}  // namespace llmd
