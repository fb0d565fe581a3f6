#include "vocab.h"

#include "unicode.h"

#include <algorithm>
#include <climits>
#include <new>

namespace llmd {

namespace {

// How the pre-tokenizer regexes see a code point. K_END stands for "past the
// end of the span": lookaheads like \s+(?!\S) stop at span boundaries.
enum Kind : uint8_t { K_END, K_LETTER, K_NUMBER, K_SPACE, K_OTHER };

Kind kind_of(uint32_t cpt) {
    const uint8_t f = cpt_flags(cpt);
    if (f & CPT_SPACE) return K_SPACE;
    if (f & CPT_LETTER) return K_LETTER;
    if (f & CPT_NUMBER) return K_NUMBER;
    return K_OTHER;  // punctuation, symbols, marks, controls, unassigned, invalid bytes
}

struct Unit {
    size_t off;    // byte offset of the character in the text
    uint32_t cpt;  // code point, or CPT_INVALID for a stray byte
    Kind kind;
};

// The units [begin, end) one regex pass runs over.
struct Span {
    const Unit *u;
    size_t begin, end;

    Kind kind(size_t i) const { return i < end ? u[i].kind : K_END; }
    uint32_t cpt(size_t i) const { return i < end ? u[i].cpt : CPT_INVALID; }
    bool newline(size_t i) const { return cpt(i) == '\r' || cpt(i) == '\n'; }
};

uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

// 's|'t|'re|'ve|'m|'ll|'d at i (any case for Llama 3): the end, or i if none.
size_t match_contraction(const Span &s, size_t i, bool any_case) {
    if (s.cpt(i) != '\'') return i;
    const uint32_t c1 = any_case ? ascii_lower(s.cpt(i + 1)) : s.cpt(i + 1);
    const uint32_t c2 = any_case ? ascii_lower(s.cpt(i + 2)) : s.cpt(i + 2);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    return i;
}

// \s+(?!\S)|\s+ at a space: a run of spaces followed by something else leaves
// its last space to the next word (" world").
size_t match_spaces(const Span &s, size_t i) {
    size_t j = i;
    while (s.kind(j) == K_SPACE) ++j;
    return (j - i > 1 && j < s.end) ? j - 1 : j;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Pushes the end of each word.
void split_gpt2(const Span &s, std::vector<size_t> &ends) {
    for (size_t i = s.begin; i < s.end;) {
        size_t j = match_contraction(s, i, false);
        if (j == i) {
            const size_t sp = s.cpt(i) == ' ';
            const Kind k = s.kind(i + sp);
            if (k == K_LETTER || k == K_NUMBER || k == K_OTHER) {
                j = i + sp;
                while (s.kind(j) == k) ++j;
            } else {
                j = match_spaces(s, i);  // s[i] is a space here
            }
        }
        ends.push_back(j);
        i = j;
    }
}

// SmolLM: \p{N} first, so every number code point is a word of its own; the
// GPT-2 pattern then runs separately on each stretch between numbers.
void split_smollm(const Span &s, std::vector<size_t> &ends) {
    for (size_t i = s.begin; i < s.end;) {
        if (s.kind(i) == K_NUMBER) {
            ends.push_back(++i);
            continue;
        }
        size_t j = i;
        while (j < s.end && s.kind(j) != K_NUMBER) ++j;
        split_gpt2(Span{s.u, i, j}, ends);
        i = j;
    }
}

// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const Span &s, std::vector<size_t> &ends) {
    for (size_t i = s.begin; i < s.end;) {
        size_t j = match_contraction(s, i, true);
        const Kind k = s.kind(i);
        const size_t sp = s.cpt(i) == ' ';
        if (j > i) {
            // contraction
        } else if (k == K_LETTER || (k != K_NUMBER && !s.newline(i) && s.kind(i + 1) == K_LETTER)) {
            j = i + 1;  // a letter, or the one non-letter allowed in front of letters
            while (s.kind(j) == K_LETTER) ++j;
        } else if (k == K_NUMBER) {
            j = i + 1;
            while (j < i + 3 && s.kind(j) == K_NUMBER) ++j;
        } else if (s.kind(i + sp) == K_OTHER) {
            j = i + sp;
            while (s.kind(j) == K_OTHER) ++j;
            while (s.newline(j)) ++j;
        } else {
            size_t after_newline = i;  // \s*[\r\n]+ ends after the run's last newline
            for (j = i; s.kind(j) == K_SPACE; ++j) {
                if (s.newline(j)) after_newline = j + 1;
            }
            j = after_newline > i ? after_newline : match_spaces(s, i);
        }
        ends.push_back(j);
        i = j;
    }
}

// One BPE symbol: a token id in a doubly linked list over the word.
struct Symbol {
    int32_t id;  // token, -1 for a byte without a token, SYM_DEAD once merged away
    int32_t prev, next;
};
constexpr int32_t SYM_DEAD = -2;

// A candidate merge of symbols[left] with its right neighbour, valid only while
// both still hold the ids it was made from.
struct Bigram {
    int32_t rank, left;
    int32_t left_id, right_id, merged;
};

// Heap order: lowest rank first, then leftmost (as HF tokenizers and llama.cpp).
bool bigram_after(const Bigram &a, const Bigram &b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

struct Fragment {
    size_t begin, end;
    int32_t id;  // special token, or -1 for plain text
};

// Raw bytes of a token: GPT-2 code points back to bytes. A code point outside
// the mapping (a vocabulary quirk) keeps its UTF-8 bytes rather than failing.
std::string decode_piece(const std::string &text, int32_t type) {
    if (type == TOKEN_CONTROL || type == TOKEN_UNKNOWN || type == TOKEN_USER_DEFINED) {
        return text;
    }
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

}  // namespace

struct Vocab::Scratch {
    std::vector<Unit> units;
    std::vector<size_t> ends;
    std::vector<Symbol> syms;
    std::vector<Bigram> heap;
    std::string mapped;
};

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
    if (d.model != "gpt2") {
        return fail("unsupported model " + quote(d.model) + " (only gpt2 byte-level BPE)");
    }
    if (d.pre == "smollm") {
        pre_ = Pre::Smollm;
    } else if (d.pre == "gpt2" || d.pre == "default" || d.pre.empty()) {
        pre_ = Pre::Gpt2;
    } else if (d.pre == "llama-bpe") {
        pre_ = Pre::Llama3;
        ignore_merges_ = true;  // as the Llama 3 tokenizer.json asks
    } else {
        return fail("unsupported pre-tokenizer " + quote(d.pre));
    }
    if (d.tokens.empty() || d.tokens.size() > size_t(INT32_MAX)) {
        return fail("token count " + std::to_string(d.tokens.size()) + " out of range");
    }
    if (!d.types.empty() && d.types.size() != d.tokens.size()) {
        return fail(std::to_string(d.types.size()) + " token types for " +
                    std::to_string(d.tokens.size()) + " tokens");
    }
    if (d.merges.size() > size_t(INT32_MAX)) {
        return fail("too many merges");
    }
    tokens_ = std::move(d.tokens);
    types_ = d.types.empty() ? std::vector<int32_t>(tokens_.size(), TOKEN_NORMAL) : std::move(d.types);

    const int32_t n = size();
    by_text_.reserve(tokens_.size());
    pieces_.reserve(tokens_.size());
    for (int32_t id = 0; id < n; ++id) {
        if (types_[id] < TOKEN_UNDEFINED || types_[id] > TOKEN_BYTE) {
            return fail("token " + std::to_string(id) + " has unknown type " + std::to_string(types_[id]));
        }
        const auto added = by_text_.emplace(tokens_[id], id);
        if (!added.second) {
            return fail("token " + std::to_string(id) + " " + quote(tokens_[id]) +
                        " duplicates token " + std::to_string(added.first->second));
        }
        pieces_.push_back(decode_piece(tokens_[id], types_[id]));
    }

    // A byte without a token (not seen in real vocabularies) is dropped by tokenize().
    std::string text;
    for (int b = 0; b < 256; ++b) {
        text.clear();
        utf8_append(text, byte_to_cpt(uint8_t(b)));
        byte_token_[b] = find(text);
    }

    merges_.reserve(d.merges.size());
    for (size_t rank = 0; rank < d.merges.size(); ++rank) {
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
        merges_.emplace(pair_key(left, right), Merge{int32_t(rank), merged});  // a repeat keeps the first rank
    }

    for (int32_t id = 0; id < n; ++id) {
        const int32_t t = types_[id];
        if ((t == TOKEN_CONTROL || t == TOKEN_UNKNOWN || t == TOKEN_USER_DEFINED) && !tokens_[id].empty()) {
            specials_.push_back(id);
        }
    }
    // Longer special tokens are cut out first, so a token that contains another wins.
    std::stable_sort(specials_.begin(), specials_.end(), [this](int32_t a, int32_t b) {
        return tokens_[a].size() > tokens_[b].size();
    });
    return true;
}

bool Vocab::tokenize(std::string_view text, bool parse_special, std::vector<int32_t> &out) const {
    const size_t out_size = out.size();
    if (text.size() >= size_t(INT32_MAX)) {
        return false;  // symbol links are int32
    }
    try {
        Scratch s;
        std::vector<Fragment> frags{{0, text.size(), -1}};
        std::vector<Fragment> next;
        const std::vector<int32_t> none;
        for (const int32_t id : parse_special ? specials_ : none) {
            const std::string &special = tokens_[id];
            next.clear();
            for (const Fragment &f : frags) {
                if (f.id >= 0) {
                    next.push_back(f);
                    continue;
                }
                const std::string_view area = text.substr(0, f.end);
                size_t pos = f.begin;
                for (size_t m = area.find(special, pos); m != area.npos; m = area.find(special, pos)) {
                    if (m > pos) next.push_back({pos, m, -1});
                    next.push_back({m, m + special.size(), id});
                    pos = m + special.size();
                }
                if (pos < f.end) next.push_back({pos, f.end, -1});
            }
            frags.swap(next);
        }
        for (const Fragment &f : frags) {
            if (f.id >= 0) {
                out.push_back(f.id);
            } else {
                tokenize_text(text.substr(f.begin, f.end - f.begin), s, out);
            }
        }
        return true;
    } catch (const std::bad_alloc &) {
        out.resize(out_size);
        return false;
    }
}

// Pre-tokenizes a plain-text span into words and BPE-encodes each.
void Vocab::tokenize_text(std::string_view text, Scratch &s, std::vector<int32_t> &out) const {
    s.units.clear();
    for (size_t off = 0; off < text.size();) {
        const Utf8Char c = utf8_decode(text.data() + off, text.size() - off);
        s.units.push_back({off, c.cpt, kind_of(c.cpt)});
        off += c.len;
    }
    s.ends.clear();
    const Span all{s.units.data(), 0, s.units.size()};
    switch (pre_) {
        case Pre::Gpt2: split_gpt2(all, s.ends); break;
        case Pre::Smollm: split_smollm(all, s.ends); break;
        case Pre::Llama3: split_llama3(all, s.ends); break;
    }
    size_t begin = 0;  // in bytes
    for (const size_t end_unit : s.ends) {
        const size_t end = end_unit < s.units.size() ? s.units[end_unit].off : text.size();
        tokenize_word(text.substr(begin, end - begin), s, out);
        begin = end;
    }
}

// Byte-level BPE on one word: start from one symbol per byte, then repeatedly
// merge the adjacent pair with the lowest merge rank.
void Vocab::tokenize_word(std::string_view word, Scratch &s, std::vector<int32_t> &out) const {
    if (word.size() == 1) {
        const int32_t id = byte_token_[uint8_t(word[0])];
        if (id >= 0) out.push_back(id);
        return;
    }
    if (ignore_merges_) {
        s.mapped.clear();
        for (const char c : word) utf8_append(s.mapped, byte_to_cpt(uint8_t(c)));
        const int32_t id = find(s.mapped);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    const int32_t n = int32_t(word.size());
    s.syms.clear();
    for (int32_t i = 0; i < n; ++i) {
        s.syms.push_back({byte_token_[uint8_t(word[i])], i - 1, i + 1 < n ? i + 1 : -1});
    }
    s.heap.clear();
    auto add_bigram = [this, &s](int32_t left) {
        const int32_t right = s.syms[left].next;
        if (right < 0) return;
        const int32_t l = s.syms[left].id, r = s.syms[right].id;
        const auto it = merges_.find(pair_key(l, r));
        if (it == merges_.end()) return;
        s.heap.push_back({it->second.rank, left, l, r, it->second.id});
        std::push_heap(s.heap.begin(), s.heap.end(), bigram_after);
    };
    for (int32_t i = 0; i + 1 < n; ++i) add_bigram(i);

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
        right.id = SYM_DEAD;
        left.next = right.next;
        if (right.next >= 0) s.syms[right.next].prev = b.left;
        if (left.prev >= 0) add_bigram(left.prev);
        add_bigram(b.left);
    }
    for (int32_t i = 0; i >= 0; i = s.syms[i].next) {
        if (s.syms[i].id >= 0) out.push_back(s.syms[i].id);
    }
}

std::string_view Vocab::piece(int32_t id) const {
    return id >= 0 && id < size() ? std::string_view(pieces_[id]) : std::string_view();
}

bool Vocab::is_control(int32_t id) const {
    return type(id) == TOKEN_CONTROL;
}

int32_t Vocab::type(int32_t id) const {
    return id >= 0 && id < size() ? types_[id] : TOKEN_UNDEFINED;
}

int32_t Vocab::find(std::string_view token_text) const {
    const auto it = by_text_.find(token_text);
    return it == by_text_.end() ? -1 : it->second;
}

}  // namespace llmd
