// vocab.h - the tokenizer: byte-level BPE (tokenizer.ggml.model "gpt2", and
// Gemma 4's "gemma4") with the pre-tokenizer named by tokenizer.ggml.pre, and
// SentencePiece ("llama"), each as llama.cpp applies it.
//
// Theory of operation. tokenize() runs three stages:
//   1. special tokens: the text of every user-defined token is cut out of the
//      input and emitted as its id, and with parse_special so is the text of
//      every control and unknown token (longer tokens first, as llama.cpp
//      does); without parse_special "<|im_end|>" typed by a user stays text.
//      A chat prompt is tokenized in one call with control tokens allowed only
//      inside the byte ranges of the template's own markers, so words and
//      SentencePiece's space prefix run across the template/content seams as
//      in llama.cpp, while what a user typed still stays text;
//   2. each remaining stretch of text is encoded:
//      - BPE: split into words by the pre-tokenizer (pretokenize.h); each word
//        starts as one symbol per byte (the token of the byte's GPT-2 code
//        point; for Gemma 4 one per UTF-8 character, spaces written U+2581)
//        and adjacent pairs are merged lowest merge rank first;
//      - SentencePiece: spaces become U+2581 (with one in front of the text
//        when add_space_prefix says so and the text starts the input or
//        follows a special token), the text starts as one symbol per UTF-8
//        character, and adjacent pairs whose join is a token are merged
//        highest score first;
//   3. a symbol that is no token falls back to byte tokens (<0xXX>).
// Every input byte lands in a token, so where the vocabulary has a token for
// every byte, invalid UTF-8 round-trips: the pieces of the output concatenate
// to the input (SentencePiece: after U+2581 is read back as a space and a
// prefixed space dropped). llama.cpp instead reads an invalid byte as U+FFFD;
// llmd does that only for an invalid byte the vocabulary has no token for.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llmd {

class PreTokenizer;

// A byte range [begin, end) of tokenize()'s input.
struct ByteRange {
    size_t begin, end;
};

// tokenize() refuses text this long: symbol offsets are 32-bit, and escaping
// spaces for SentencePiece triples them.
constexpr size_t kMaxTokenizeBytes = size_t(1) << 29;

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

// The tokenizer as the GGUF metadata spells it (tokenizer.ggml.*). Absent
// keys stay empty / nullopt; the defaults are the Vocab's business.
struct VocabData {
    std::vector<std::string> tokens;  // tokens (GPT-2 byte-mapped text for BPE, U+2581 for spaces in SPM)
    std::vector<int32_t> types;       // token_type; empty = all normal
    std::vector<float> scores;        // scores (SentencePiece); empty = all 0
    std::vector<std::string> merges;  // merges, "left right", rank = index
    std::string model;                // model: "gpt2", "llama", "gemma4"
    std::string pre;                  // pre: the pre-tokenizer's name, or ""
    std::string name;                 // general.name (Phi-3 strips spaces after special tokens)
    std::optional<uint32_t> bos, eos, eot, eom, unk;                             // *_token_id
    std::optional<uint32_t> fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;  // fim_*_token_id
    std::optional<bool> add_bos, add_eos, add_space_prefix;                     // add_*_token, add_space_prefix
};

class Vocab {
public:
    // Validates `data` and builds the lookup tables. On failure returns nullptr
    // and sets *error (if error is not null). Never throws.
    static std::unique_ptr<Vocab> create(VocabData data, std::string *error);

    // Appends the ids of `text` to `out` (no BOS/EOS). Thread-safe (const, no
    // shared scratch). Returns false if memory runs out or text is
    // kMaxTokenizeBytes or more; `out` is then left as it was.
    bool tokenize(std::string_view text, bool parse_special, std::vector<int32_t> &out) const;

    // As above, but a control or unknown token's text is matched only where it
    // lies wholly inside one of `controls` (sorted, not overlapping, within the
    // text). If `offsets` is not null it gets, per id appended, the byte offset
    // in text where that token starts (a SentencePiece prefix space starts with
    // the text after it), or -1 inside a stretch whose pieces do not spell its
    // text (a byte read as U+FFFD or as the unknown token).
    bool tokenize(std::string_view text, const std::vector<ByteRange> &controls, std::vector<int32_t> &out,
                  std::vector<int64_t> *offsets) const;

    // The token's raw bytes (may be part of a UTF-8 character). Control, unknown
    // and user-defined tokens give their text. Empty for an out-of-range id.
    std::string_view piece(int32_t id) const;

    // Control and unknown tokens: their piece is shown only when asked for.
    bool is_control(int32_t id) const;
    int32_t size() const { return static_cast<int32_t>(tokens_.size()); }

    // The id of the token whose GGUF text is token_text, or -1.
    int32_t find(std::string_view token_text) const;

    // Special ids as llama.cpp settles them (the file's keys over the
    // defaults of the tokenizer type), -1 for none.
    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    int32_t eot() const { return eot_; }  // end of turn (<|eot_id|>, <|im_end|>, ...)
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    // End-of-generation ids: EOS, EOT, EOM, and the tokens whose text ends a
    // turn in some family (<|im_end|>, <end_of_turn>, <|eot_id|>, ...).
    const std::vector<int32_t> &eog_ids() const { return eog_; }
    // Fill-in-the-middle: the prefix, suffix and middle markers, the repository
    // name's and the file separator (pad, repo and sep also end generation).
    struct Fim {
        int32_t pre = -1, suf = -1, mid = -1, pad = -1, rep = -1, sep = -1;
    };
    const Fim &fim() const { return fim_; }

    Vocab(const Vocab &) = delete;
    Vocab &operator=(const Vocab &) = delete;
    ~Vocab();

private:
    enum class Algo { Bpe, Spm };
    // Merges by pair: an open-addressing table (the lookup is BPE's hot spot).
    class MergeTable {
    public:
        struct Merge {
            uint64_t key;  // (left id << 32 | right id); kEmpty for a free slot
            int32_t rank;
            int32_t id;    // token of the merged pair
        };
        static constexpr uint64_t kEmpty = ~uint64_t(0);  // no pair of valid ids has it
        void reserve(size_t n);
        // Adds the merge unless the pair is already there (a repeat keeps the first rank).
        void add(int32_t left, int32_t right, int32_t rank, int32_t id);
        const Merge *find(int32_t left, int32_t right) const;

    private:
        size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }
        std::vector<Merge> slots_;
        int shift_ = 64;
    };
    struct Scratch;

    Vocab() = default;
    bool build(VocabData &data, std::string *error);
    void settle_specials(const VocabData &data);
    int32_t settle_unknown(const VocabData &data) const;
    void encode(std::string_view text, bool after_special, Scratch &s, std::vector<int32_t> &out) const;
    void text_offsets(std::string_view text, size_t begin, bool prefixed, const int32_t *ids, size_t n,
                      std::vector<int64_t> &offsets) const;
    void bpe_word(std::string_view word, Scratch &s, std::vector<int32_t> &out) const;
    void spm_text(std::string_view text, Scratch &s, std::vector<int32_t> &out) const;
    void byte_fallback(std::string_view bytes, std::vector<int32_t> &out) const;

    Algo algo_ = Algo::Bpe;
    std::unique_ptr<PreTokenizer> pre_;  // BPE only
    bool ignore_merges_ = false;         // a word that is a whole token skips BPE
    bool raw_utf8_ = false;              // BPE over UTF-8 characters, spaces as U+2581 (Gemma 4)
    bool add_space_prefix_ = false;      // SentencePiece: " " in front of text
    std::vector<std::string> tokens_;
    std::vector<uint8_t> attrs_;                            // ATTR_* bits per id
    std::vector<float> scores_;
    std::vector<std::string> pieces_;                       // raw bytes per id
    std::unordered_map<std::string_view, int32_t> by_text_; // views into tokens_
    MergeTable merges_;
    int32_t byte_token_[256] = {};                          // token of each byte, or -1
    std::vector<int32_t> no_byte_token_;                    // SPM: what a byte without a token becomes
    std::vector<int32_t> specials_;                         // longest text first
    int32_t bos_ = -1, eos_ = -1, eot_ = -1;
    bool add_bos_ = false, add_eos_ = false;
    std::vector<int32_t> eog_;
    Fim fim_;
};

}  // namespace llmd
