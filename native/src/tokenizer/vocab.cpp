#include "tokenizer/vocab.h"

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

#include <algorithm>
#include <climits>
#include <iterator>
#include <new>

namespace llmd {

namespace {

// What a token is, as bits: the file's type, plus what llama.cpp adds to it
// (an end-of-turn text made control, Phi-3's stripping of spaces around
// special tokens).
enum Attr : uint8_t {
    ATTR_NORMAL = 1,
    ATTR_UNKNOWN = 2,
    ATTR_CONTROL = 4,
    ATTR_USER_DEFINED = 8,
    ATTR_UNUSED = 16,
    ATTR_BYTE = 32,
    ATTR_LSTRIP = 64,  // spaces before the token belong to it
    ATTR_RSTRIP = 128, // spaces after the token belong to it
};

uint8_t attr_of(int32_t type) {
    switch (type) {
        case TOKEN_UNKNOWN: return ATTR_UNKNOWN;
        case TOKEN_CONTROL: return ATTR_CONTROL;
        case TOKEN_USER_DEFINED: return ATTR_USER_DEFINED;
        case TOKEN_UNUSED: return ATTR_UNUSED;
        case TOKEN_BYTE: return ATTR_BYTE;
        default: return ATTR_NORMAL;  // TOKEN_NORMAL, and TOKEN_UNDEFINED treated as normal
    }
}

const std::string_view k_space = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// One merge symbol: a token id (or -1) for bytes [off, off + len) of its word,
// in a doubly linked list over the word.
struct Symbol {
    int32_t id;  // token, -1 for text without a token, SYM_DEAD once merged away
    int32_t prev, next;
    uint32_t off, len;
};
constexpr int32_t SYM_DEAD = -2;

// A candidate BPE merge of symbols[left] with its right neighbour, valid only
// while both still hold the ids it was made from.
struct Bigram {
    int32_t rank, left;
    int32_t left_id, right_id, merged;
};

// Heap order: lowest rank first, then leftmost (as HF tokenizers and llama.cpp).
bool bigram_after(const Bigram &a, const Bigram &b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

// A candidate SentencePiece merge, valid while its two symbols still have the
// lengths it was made from.
struct SpmBigram {
    float score;
    int32_t left, right;
    uint32_t size;
};

// Heap order: highest score first, then leftmost (as llama.cpp).
bool spm_after(const SpmBigram &a, const SpmBigram &b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
}

uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

struct Fragment {
    size_t begin, end;
    int32_t id;  // special token, or -1 for plain text
};

// Bytes of the character at text[off]: a valid UTF-8 sequence, else the one
// byte (so a stray byte cannot swallow the U+2581 written for the next space).
uint32_t char_length(std::string_view text, uint32_t off) {
    return utf8_decode(text.data() + off, text.size() - off).len;
}

// The byte of a "<0xXX>" token, or -1.
int hex_byte(std::string_view text) {
    auto digit = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    };
    if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
    const int hi = digit(text[3]), lo = digit(text[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string hex_token(uint8_t b) {
    static const char k_hex[] = "0123456789ABCDEF";
    return std::string("<0x") + k_hex[b >> 4] + k_hex[b & 15] + ">";
}

// GPT-2 code points back to bytes. A code point outside the mapping (a
// vocabulary quirk) keeps its UTF-8 bytes rather than failing.
std::string gpt2_bytes(const std::string &text) {
    std::string out;
    for (size_t off = 0; off < text.size();) {
        const Utf8Char c = utf8_decode(text.data() + off, text.size() - off);
        const int byte = c.cpt == CPT_INVALID ? -1 : byte_from_cpt(c.cpt);
        if (byte >= 0) {
            out += static_cast<char>(byte);
        } else {
            out.append(text, off, c.len);
        }
        off += c.len;
    }
    return out;
}

// U+2581 back to spaces.
std::string unescape_spaces(const std::string &text) {
    std::string out;
    for (size_t off = 0; off < text.size();) {
        if (text.compare(off, k_space.size(), k_space) == 0) {
            out += ' ';
            off += k_space.size();
        } else {
            out += text[off++];
        }
    }
    return out;
}

bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// A token for an error message: short, and quoted.
std::string quote(std::string_view text) {
    const size_t max = 40;
    return "'" + std::string(text.substr(0, max)) + (text.size() > max ? "...'" : "'");
}

void set_error(std::string *error, const char *msg) noexcept {
    if (error) {
        try {
            *error = msg;
        } catch (...) {
        }
    }
}

// Token texts llama.cpp recognises by name (its convert scripts do not always
// write the ids): each list in the order it is searched.
const char *const k_eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                   "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                   "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                   "<end_of_utterance>"};
const char *const k_fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                       "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
                                       "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"};
const char *const k_fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                       "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>",
                                       "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"};
const char *const k_fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                       "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
                                       "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};
const char *const k_fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
const char *const k_fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
const char *const k_fim_sep_texts[] = {"<|file_sep|>"};
// Texts that end generation in some family.
const char *const k_eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                                   "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                   "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
                                   "<turn|>", "<|tool_response>",
                                   "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["};

}  // namespace

void Vocab::MergeTable::reserve(size_t n) {
    size_t cap = 16;
    shift_ = 60;
    while (cap < 2 * n) cap *= 2, --shift_;  // at most half full
    slots_.assign(cap, Merge{kEmpty, 0, 0});
}

void Vocab::MergeTable::add(int32_t left, int32_t right, int32_t rank, int32_t id) {
    const uint64_t key = pair_key(left, right);
    for (size_t i = slot(key);; i = (i + 1) & (slots_.size() - 1)) {
        if (slots_[i].key == key) return;
        if (slots_[i].key == kEmpty) {
            slots_[i] = Merge{key, rank, id};
            return;
        }
    }
}

const Vocab::MergeTable::Merge *Vocab::MergeTable::find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pair_key(left, right);
    for (size_t i = slot(key);; i = (i + 1) & (slots_.size() - 1)) {
        if (slots_[i].key == key) return &slots_[i];
        if (slots_[i].key == kEmpty) return nullptr;
    }
}

struct Vocab::Scratch {
    std::vector<PreUnit> units;
    std::vector<size_t> ends;
    std::vector<Symbol> syms;
    std::vector<Bigram> heap;
    std::vector<SpmBigram> spm_heap;
    std::string text;      // escaped or byte-mapped copy
    std::string replaced;  // the text with tokenless invalid bytes read as U+FFFD
};

Vocab::~Vocab() = default;

std::unique_ptr<Vocab> Vocab::create(VocabData data, std::string *error) {
    try {
        std::unique_ptr<Vocab> vocab(new Vocab());
        std::string why;
        if (!vocab->build(data, &why)) {
            if (error) *error = std::move(why);
            return nullptr;
        }
        return vocab;
    } catch (const std::bad_alloc &) {
        set_error(error, "out of memory while building the vocabulary");
    } catch (const std::exception &e) {
        set_error(error, e.what());
    }
    return nullptr;
}

bool Vocab::build(VocabData &d, std::string *error) {
    auto fail = [error](std::string msg) {
        *error = std::move(msg);  // the caller says where it came from
        return false;
    };
    std::string pre_name = d.pre;
    if (d.model == "gpt2") {
        algo_ = Algo::Bpe;
        if (pre_name.empty()) pre_name = "default";  // llama.cpp's fallback, with its warning
    } else if (d.model == "gemma4") {
        algo_ = Algo::Bpe;
        pre_name = "gemma4";  // the model implies it
    } else if (d.model == "llama") {
        algo_ = Algo::Spm;
    } else {
        const char *what = d.model == "bert"   ? " (WordPiece)"
                           : d.model == "t5"   ? " (Unigram)"
                           : d.model == "rwkv" ? " (RWKV)"
                                               : "";
        return fail("unsupported tokenizer model " + quote(d.model) + what +
                    "; llmd tokenizes gpt2 and gemma4 (BPE) and llama (SentencePiece)");
    }
    if (algo_ == Algo::Bpe) {
        std::string why;
        pre_ = PreTokenizer::create(pre_name, &why);
        if (!pre_) return fail(why);
        ignore_merges_ = pre_->options() & PRE_IGNORE_MERGES;
        raw_utf8_ = pre_->options() & PRE_RAW_UTF8;
    }
    if (d.tokens.empty() || d.tokens.size() > size_t(INT32_MAX)) {
        return fail("token count " + std::to_string(d.tokens.size()) + " out of range");
    }
    if (!d.types.empty() && d.types.size() != d.tokens.size()) {
        return fail(std::to_string(d.types.size()) + " token types for " +
                    std::to_string(d.tokens.size()) + " tokens");
    }
    if (!d.scores.empty() && d.scores.size() != d.tokens.size()) {
        return fail(std::to_string(d.scores.size()) + " token scores for " +
                    std::to_string(d.tokens.size()) + " tokens");
    }
    if (d.merges.size() > size_t(INT32_MAX)) {
        return fail("too many merges");
    }
    tokens_ = std::move(d.tokens);
    scores_ = d.scores.empty() ? std::vector<float>(tokens_.size(), 0.0f) : std::move(d.scores);

    const int32_t n = size();
    attrs_.resize(tokens_.size());
    by_text_.reserve(tokens_.size());
    for (int32_t id = 0; id < n; ++id) {
        const int32_t type = d.types.empty() ? TOKEN_NORMAL : d.types[id];
        if (type < TOKEN_UNDEFINED || type > TOKEN_BYTE) {
            return fail("token " + std::to_string(id) + " has unknown type " + std::to_string(type));
        }
        attrs_[id] = attr_of(type);
        if (tokens_[id].empty()) tokens_[id] = "[EMPTY_" + std::to_string(id) + "]";  // as llama.cpp names it
        const auto added = by_text_.emplace(tokens_[id], id);
        if (!added.second) {
            return fail("token " + std::to_string(id) + " " + quote(tokens_[id]) +
                        " duplicates token " + std::to_string(added.first->second));
        }
    }

    // The token each byte falls back to (see no_byte_token_ for a byte without one).
    std::string text;
    for (int b = 0; b < 256; ++b) {
        if (algo_ == Algo::Bpe && !raw_utf8_) {
            text.clear();
            utf8_append(text, byte_to_cpt(uint8_t(b)));
            byte_token_[b] = find(text);
        } else {
            byte_token_[b] = find(hex_token(uint8_t(b)));
            if (byte_token_[b] < 0 && algo_ == Algo::Spm) byte_token_[b] = find(std::string(1, char(b)));
        }
    }

    merges_.reserve(d.merges.size());
    for (size_t rank = 0; algo_ == Algo::Bpe && rank < d.merges.size(); ++rank) {
        const std::string_view m = d.merges[rank];
        const size_t sp = m.find(' ', 1);  // from 1: a left side may itself be " "
        const int32_t left = sp == m.npos ? -1 : find(m.substr(0, sp));
        const int32_t right = sp == m.npos ? -1 : find(m.substr(sp + 1));
        text.assign(m.substr(0, std::min(sp, m.size())));
        if (sp != m.npos) text.append(m.substr(sp + 1));
        const int32_t merged = find(text);
        if (left < 0 || right < 0 || merged < 0) {
            return fail("merge " + std::to_string(rank) + " " + quote(m) +
                        " is not two known tokens whose join is a token");
        }
        merges_.add(left, right, int32_t(rank), merged);
    }

    settle_specials(d);

    // SentencePiece and Gemma 4 write a byte without a <0xXX> token as the
    // unknown token. (Byte-level BPE drops it, as llama.cpp does: see encode().)
    if (algo_ == Algo::Spm || raw_utf8_) {
        if (const int32_t unk = settle_unknown(d); unk >= 0) no_byte_token_.push_back(unk);
    }

    pieces_.reserve(tokens_.size());
    for (int32_t id = 0; id < n; ++id) {
        const uint8_t a = attrs_[id];
        const std::string &t = tokens_[id];
        const int byte = (a & ATTR_BYTE) ? hex_byte(t) : -1;
        if (a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED)) {
            pieces_.push_back(t);
        } else if (byte >= 0) {
            pieces_.emplace_back(1, char(byte));
        } else if (algo_ == Algo::Spm || raw_utf8_) {
            pieces_.push_back(unescape_spaces(t));
        } else {
            pieces_.push_back(gpt2_bytes(t));
        }
    }

    for (int32_t id = 0; id < n; ++id) {
        if ((attrs_[id] & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED)) && !tokens_[id].empty()) {
            specials_.push_back(id);
        }
    }
    // Longer special tokens are cut out first, so a token that contains another wins.
    std::stable_sort(specials_.begin(), specials_.end(), [this](int32_t a, int32_t b) {
        return tokens_[a].size() > tokens_[b].size();
    });

    // Phi-3 keeps the spaces after its special tokens out of the text (llama.cpp
    // recognises the family by name).
    std::string lower = d.name;
    for (char &c : lower) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    if (lower.find("phi-3") != lower.npos || lower.find("phi3") != lower.npos) {
        for (const int32_t id : specials_) attrs_[id] |= ATTR_RSTRIP;
        if (const int32_t id = find("</s>"); id >= 0) attrs_[id] |= ATTR_RSTRIP;
        for (const char *t : {"<unk>", "<s>", "<|endoftext|>"}) {
            if (const int32_t id = find(t); id >= 0) attrs_[id] &= uint8_t(~ATTR_RSTRIP);
        }
    }
    return true;
}

// The unknown token: the file's, else SentencePiece's default 0, else none.
int32_t Vocab::settle_unknown(const VocabData &d) const {
    if (d.unk && *d.unk < uint32_t(size())) return int32_t(*d.unk);
    return algo_ == Algo::Spm ? 0 : -1;
}

// BOS, EOS and the end-of-generation set, in llama.cpp's order of decisions.
void Vocab::settle_specials(const VocabData &d) {
    const int64_t n = size();
    int64_t bos = -1, eos = -1;
    if (algo_ == Algo::Spm) {
        bos = 1, eos = 2;
        add_bos_ = true;
        add_space_prefix_ = true;
    } else if (!raw_utf8_) {
        bos = 11, eos = 11;  // llama.cpp's defaults for BPE files that name none
        add_bos_ = pre_->options() & PRE_ADD_BOS;
        if (pre_->options() & PRE_NO_BOS) bos = -1;
    }
    auto settle = [n](int64_t dflt, const std::optional<uint32_t> &key) -> int32_t {
        if (dflt >= n) dflt = -1;
        return int32_t(key && *key < n ? int64_t(*key) : dflt);
    };
    bos_ = settle(bos, d.bos);
    eos_ = settle(eos, d.eos);
    eot_ = settle(-1, d.eot);
    int32_t eom = settle(-1, d.eom);
    fim_ = {settle(-1, d.fim_pre), settle(-1, d.fim_suf), settle(-1, d.fim_mid),
            settle(-1, d.fim_pad), settle(-1, d.fim_rep), settle(-1, d.fim_sep)};
    if (d.add_bos) add_bos_ = *d.add_bos;
    if (d.add_eos) add_eos_ = *d.add_eos;
    if (d.add_space_prefix) add_space_prefix_ = *d.add_space_prefix;
    if (raw_utf8_) add_bos_ = true;  // Gemma 4 always starts with BOS
    if (bos_ < 0) add_bos_ = false;
    if (eos_ < 0) add_eos_ = false;

    // A token found by its text is control even if the file says otherwise.
    auto by_text = [this](int32_t &id, const auto &texts) {
        for (const char *t : texts) {
            const int32_t found = find(t);
            if (id < 0 && found >= 0) {
                id = found;
                attrs_[found] |= ATTR_CONTROL;
            }
        }
    };
    by_text(eot_, k_eot_texts);
    by_text(eom, std::initializer_list<const char *>{"<|eom_id|>"});
    by_text(fim_.pre, k_fim_pre_texts);
    by_text(fim_.suf, k_fim_suf_texts);
    by_text(fim_.mid, k_fim_mid_texts);
    by_text(fim_.pad, k_fim_pad_texts);
    by_text(fim_.rep, k_fim_rep_texts);
    by_text(fim_.sep, k_fim_sep_texts);

    auto add_eog = [this](int32_t id) {
        if (id >= 0 && std::find(eog_.begin(), eog_.end(), id) == eog_.end()) eog_.push_back(id);
    };
    for (const int32_t id : {fim_.pad, fim_.rep, fim_.sep}) add_eog(id);
    for (const char *t : k_eog_texts) {
        if (const int32_t id = find(t); id >= 0) {
            add_eog(id);
            attrs_[id] |= ATTR_CONTROL;
        }
    }
    // gpt-oss writes these markers in its replies; they must stay visible.
    for (const char *t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
        if (const int32_t id = find(t); id >= 0) attrs_[id] = ATTR_USER_DEFINED;
    }
    for (const int32_t id : {eos_, eot_, eom}) add_eog(id);

    auto has = [this](const char *t) {
        const int32_t id = find(t);
        return id >= 0 && std::find(eog_.begin(), eog_.end(), id) != eog_.end();
    };
    auto drop = [this](const char *t, uint8_t attr) {
        const int32_t id = find(t);
        eog_.erase(std::remove(eog_.begin(), eog_.end(), id), eog_.end());
        attrs_[id] = attr;
    };
    // gpt-oss (harmony) and solar-open continue after <|end|>; it ends a message, not the turn.
    if (has("<|end|>") && ((has("<|return|>") && (has("<|call|>") || has("<|calls|>"))) ||
                           ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>")))) {
        drop("<|end|>", ATTR_USER_DEFINED);
    }
    // Gemma 4 and PLaMo have an ordinary </s>.
    if (has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>"))) drop("</s>", ATTR_NORMAL);
    std::sort(eog_.begin(), eog_.end());
}

bool Vocab::tokenize(std::string_view text, bool parse_special, std::vector<int32_t> &out) const {
    try {
        std::vector<ByteRange> controls;
        if (parse_special) controls.push_back({0, text.size()});
        return tokenize(text, controls, out, nullptr);
    } catch (const std::bad_alloc &) {
        return false;
    }
}

bool Vocab::tokenize(std::string_view text, const std::vector<ByteRange> &controls, std::vector<int32_t> &out,
                     std::vector<int64_t> *offsets) const {
    const size_t out_size = out.size(), offsets_size = offsets ? offsets->size() : 0;
    if (text.size() >= kMaxTokenizeBytes) {
        return false;
    }
    // Whether [begin, end) lies wholly inside one control range.
    auto allowed = [&controls](size_t begin, size_t end) {
        auto it = std::upper_bound(controls.begin(), controls.end(), begin,
                                   [](size_t pos, const ByteRange &r) { return pos < r.begin; });
        return it != controls.begin() && end <= std::prev(it)->end;
    };
    try {
        Scratch s;
        std::vector<Fragment> frags;  // empty input, no fragment: SentencePiece adds no space then
        if (!text.empty()) frags.push_back({0, text.size(), -1});
        std::vector<Fragment> next;
        for (const int32_t id : specials_) {
            const uint8_t attr = attrs_[id];
            const bool control = attr & (ATTR_CONTROL | ATTR_UNKNOWN);
            if (control && controls.empty()) continue;
            const std::string &special = tokens_[id];
            next.clear();
            for (const Fragment &f : frags) {
                if (f.id >= 0) {
                    next.push_back(f);
                    continue;
                }
                const std::string_view area = text.substr(0, f.end);
                size_t pos = f.begin;  // the text before pos is cut
                size_t from = pos;     // where the next search starts
                for (size_t m; (m = area.find(special, from)) != area.npos;) {
                    from = m + 1;
                    if (control && !allowed(m, m + special.size())) continue;  // not a marker: stays text
                    size_t left_end = m;
                    if (attr & ATTR_LSTRIP) {
                        while (left_end > pos && ascii_space(text[left_end - 1])) --left_end;
                    }
                    if (left_end > pos) next.push_back({pos, left_end, -1});
                    next.push_back({m, m + special.size(), id});
                    pos = m + special.size();
                    if (attr & ATTR_RSTRIP) {
                        while (pos < f.end && ascii_space(text[pos])) ++pos;
                    }
                    from = pos;
                }
                if (pos < f.end) next.push_back({pos, f.end, -1});
            }
            frags.swap(next);
        }
        bool after_special = true;  // the start of the input counts as one
        for (const Fragment &f : frags) {
            if (f.id >= 0) {
                out.push_back(f.id);
                if (offsets) offsets->push_back(int64_t(f.begin));
                after_special = true;
            } else {
                const size_t first = out.size();
                const std::string_view stretch = text.substr(f.begin, f.end - f.begin);
                encode(stretch, after_special, s, out);
                if (offsets) {
                    const bool prefixed = algo_ == Algo::Spm && add_space_prefix_ && after_special;
                    text_offsets(stretch, f.begin, prefixed, out.data() + first, out.size() - first, *offsets);
                }
                after_special = false;
            }
        }
        return true;
    } catch (const std::bad_alloc &) {
        out.resize(out_size);
        if (offsets) offsets->resize(offsets_size);
        return false;
    }
}

// Where each of the n tokens `ids` that encode `stretch` (at byte `begin` of the
// input) starts: every one when their pieces spell the stretch (after a
// prefixed space), else only the first.
void Vocab::text_offsets(std::string_view stretch, size_t begin, bool prefixed, const int32_t *ids, size_t n,
                         std::vector<int64_t> &offsets) const {
    const size_t first = offsets.size();
    std::string_view rest = stretch;
    bool spelled = true;
    for (size_t i = 0; i < n && spelled; ++i) {
        std::string_view p = piece(ids[i]);
        offsets.push_back(int64_t(begin + (stretch.size() - rest.size())));
        if (prefixed) {  // the space SentencePiece put in front is not in the input
            spelled = !p.empty() && p[0] == ' ';
            p.remove_prefix(spelled ? 1 : 0);
            prefixed = false;
        }
        spelled = spelled && rest.substr(0, p.size()) == p;
        rest.remove_prefix(std::min(p.size(), rest.size()));
    }
    if (spelled && rest.empty()) return;
    offsets.resize(first);
    for (size_t i = 0; i < n; ++i) offsets.push_back(i == 0 ? int64_t(begin) : -1);
}

// Encodes one stretch of plain text.
void Vocab::encode(std::string_view text, bool after_special, Scratch &s, std::vector<int32_t> &out) const {
    if (algo_ == Algo::Spm || raw_utf8_) {
        s.text.clear();
        if (algo_ == Algo::Spm && add_space_prefix_ && after_special) s.text += k_space;
        for (const char c : text) {
            if (c == ' ') {
                s.text += k_space;
            } else {
                s.text += c;
            }
        }
        if (algo_ == Algo::Spm) {
            spm_text(s.text, s, out);
            return;
        }
        text = s.text;  // Gemma 4: BPE over the escaped text; s.text stays untouched below
    }
    if (pre_units(text, s.units) && !raw_utf8_) {
        // An invalid byte the vocabulary has no token for is read as U+FFFD, as
        // llama.cpp reads every invalid byte (a byte with a token stays itself).
        auto tokenless = [&](const PreUnit &u) {
            return u.cpt == CPT_INVALID && byte_token_[uint8_t(text[u.off])] < 0;
        };
        if (std::any_of(s.units.begin(), s.units.end(), tokenless)) {
            s.replaced.clear();
            for (size_t i = 0; i < s.units.size(); ++i) {
                const size_t end = i + 1 < s.units.size() ? s.units[i + 1].off : text.size();
                if (tokenless(s.units[i])) {
                    s.replaced += "\xEF\xBF\xBD";
                } else {
                    s.replaced.append(text, s.units[i].off, end - s.units[i].off);
                }
            }
            text = s.replaced;
            pre_units(text, s.units);
        }
    }
    pre_->split(s.units, s.ends);
    size_t begin = 0;  // in bytes
    for (const size_t end_unit : s.ends) {
        const size_t end = end_unit < s.units.size() ? s.units[end_unit].off : text.size();
        bpe_word(text.substr(begin, end - begin), s, out);
        begin = end;
    }
}

// BPE on one word: start from one symbol per byte (per UTF-8 character for
// Gemma 4), then repeatedly merge the adjacent pair with the lowest merge rank.
void Vocab::bpe_word(std::string_view word, Scratch &s, std::vector<int32_t> &out) const {
    if (!raw_utf8_ && word.size() == 1) {
        byte_fallback(word, out);
        return;
    }
    const bool newlines = raw_utf8_ && word.find_first_not_of('\n') == word.npos;  // Gemma 4's rule
    if (ignore_merges_ || newlines) {
        int32_t id;
        if (raw_utf8_) {
            id = find(word);
        } else {  // s.text is free: only the raw UTF-8 path keeps the word in it
            s.text.clear();
            for (const char c : word) utf8_append(s.text, byte_to_cpt(uint8_t(c)));
            id = find(s.text);
        }
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    s.syms.clear();
    for (uint32_t off = 0; off < word.size();) {
        const uint32_t len = raw_utf8_ ? char_length(word, off) : 1;
        const int32_t id = raw_utf8_ ? find(word.substr(off, len)) : byte_token_[uint8_t(word[off])];
        const int32_t i = int32_t(s.syms.size());
        s.syms.push_back({id, i - 1, off + len < word.size() ? i + 1 : -1, off, len});
        off += len;
    }
    s.heap.clear();
    auto add_bigram = [this, &s](int32_t left) {
        const int32_t right = s.syms[left].next;
        if (right < 0) return;
        const int32_t l = s.syms[left].id, r = s.syms[right].id;
        if (l < 0 || r < 0) return;
        const MergeTable::Merge *m = merges_.find(l, r);
        if (m == nullptr) return;
        s.heap.push_back({m->rank, left, l, r, m->id});
        std::push_heap(s.heap.begin(), s.heap.end(), bigram_after);
    };
    for (int32_t i = 0; i + 1 < int32_t(s.syms.size()); ++i) add_bigram(i);

    while (!s.heap.empty()) {
        std::pop_heap(s.heap.begin(), s.heap.end(), bigram_after);
        const Bigram b = s.heap.back();
        s.heap.pop_back();
        Symbol &left = s.syms[b.left];
        if (left.id != b.left_id || left.next < 0 || s.syms[left.next].id != b.right_id) {
            continue;  // stale: one side has merged since
        }
        Symbol &right = s.syms[left.next];
        left.id = b.merged;
        left.len += right.len;
        right.id = SYM_DEAD;
        left.next = right.next;
        if (right.next >= 0) s.syms[right.next].prev = b.left;
        if (left.prev >= 0) add_bigram(left.prev);
        add_bigram(b.left);
    }
    for (int32_t i = 0; i >= 0; i = s.syms[i].next) {
        const Symbol &sym = s.syms[i];
        if (sym.id >= 0) {
            out.push_back(sym.id);
        } else {
            byte_fallback(word.substr(sym.off, sym.len), out);
        }
    }
}

// SentencePiece on one escaped stretch: one symbol per character, then merge
// the adjacent pair whose join is the token of highest score, leftmost first.
void Vocab::spm_text(std::string_view text, Scratch &s, std::vector<int32_t> &out) const {
    s.syms.clear();
    for (uint32_t off = 0; off < text.size();) {
        const uint32_t len = char_length(text, off);
        const int32_t i = int32_t(s.syms.size());
        s.syms.push_back({0, i - 1, off + len < text.size() ? i + 1 : -1, off, len});
        off += len;
    }
    s.spm_heap.clear();
    auto add_bigram = [this, &s, text](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const uint32_t size = s.syms[left].len + s.syms[right].len;
        const int32_t id = find(text.substr(s.syms[left].off, size));
        if (id < 0) return;
        s.spm_heap.push_back({scores_[id], left, right, size});
        std::push_heap(s.spm_heap.begin(), s.spm_heap.end(), spm_after);
    };
    for (int32_t i = 1; i < int32_t(s.syms.size()); ++i) add_bigram(i - 1, i);

    while (!s.spm_heap.empty()) {
        std::pop_heap(s.spm_heap.begin(), s.spm_heap.end(), spm_after);
        const SpmBigram b = s.spm_heap.back();
        s.spm_heap.pop_back();
        Symbol &left = s.syms[b.left];
        Symbol &right = s.syms[b.right];
        if (left.len == 0 || right.len == 0 || left.len + right.len != b.size) {
            continue;  // stale: one side has merged since
        }
        left.len += right.len;
        right.len = 0;
        left.next = right.next;
        if (right.next >= 0) s.syms[right.next].prev = b.left;
        add_bigram(left.prev, b.left);
        add_bigram(b.left, left.next);
    }
    for (int32_t i = s.syms.empty() ? -1 : 0; i >= 0; i = s.syms[i].next) {
        const std::string_view piece = text.substr(s.syms[i].off, s.syms[i].len);
        const int32_t id = find(piece);
        if (id >= 0) {
            out.push_back(id);
        } else {
            byte_fallback(piece, out);
        }
    }
}

void Vocab::byte_fallback(std::string_view bytes, std::vector<int32_t> &out) const {
    for (const char c : bytes) {
        const int32_t id = byte_token_[uint8_t(c)];
        if (id >= 0) {
            out.push_back(id);
        } else {
            out.insert(out.end(), no_byte_token_.begin(), no_byte_token_.end());
        }
    }
}

std::string_view Vocab::piece(int32_t id) const {
    return id >= 0 && id < size() ? std::string_view(pieces_[id]) : std::string_view();
}

bool Vocab::is_control(int32_t id) const {
    return id >= 0 && id < size() && (attrs_[id] & (ATTR_CONTROL | ATTR_UNKNOWN));
}

int32_t Vocab::find(std::string_view token_text) const {
    const auto it = by_text_.find(token_text);
    return it == by_text_.end() ? -1 : it->second;
}

}  // namespace llmd
