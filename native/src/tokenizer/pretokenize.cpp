#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

#include <climits>

namespace llmd {

namespace {

// The words [begin, end) one pass runs over.
struct Span {
    const PreUnit *u;
    size_t begin, end;

    uint32_t cpt(size_t i) const { return i < end ? u[i].cpt : CPT_INVALID; }
    bool newline(size_t i) const { return cpt(i) == '\r' || cpt(i) == '\n'; }
};

// Kind of unit i; with MARKS, combining marks count as letters (Qwen 3.5).
template <bool MARKS> PreKind kind(const Span &s, size_t i) {
    if (i >= s.end) return PRE_END;
    const PreKind k = s.u[i].kind;
    return MARKS && k == PRE_OTHER && (s.u[i].flags & CPT_MARK) ? PRE_LETTER : k;
}

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
    while (kind<false>(s, j) == PRE_SPACE) ++j;
    return (j - i > 1 && j < s.end) ? j - 1 : j;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
void split_gpt2(const Span &s, std::vector<size_t> &ends) {
    for (size_t i = s.begin; i < s.end;) {
        size_t j = match_contraction(s, i, false);
        if (j == i) {
            const size_t sp = s.cpt(i) == ' ';
            const PreKind k = kind<false>(s, i + sp);
            if (k == PRE_LETTER || k == PRE_NUMBER || k == PRE_OTHER) {
                j = i + sp;
                while (kind<false>(s, j) == k) ++j;
            } else {
                j = match_spaces(s, i);  // s[i] is a space here
            }
        }
        ends.push_back(j);
        i = j;
    }
}

// Llama 3 (DIGITS 3, MARKS false), Qwen 2 (1, false) and Qwen 3.5 (1, true):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,DIGITS}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (\p{L} is [\p{L}\p{M}] with MARKS)
template <size_t DIGITS, bool MARKS> void split_llama3(const Span &s, std::vector<size_t> &ends) {
    for (size_t i = s.begin; i < s.end;) {
        size_t j = match_contraction(s, i, true);
        const PreKind k = kind<MARKS>(s, i);
        const size_t sp = s.cpt(i) == ' ';
        if (j > i) {
            // contraction
        } else if (k == PRE_LETTER || (k != PRE_NUMBER && !s.newline(i) && kind<MARKS>(s, i + 1) == PRE_LETTER)) {
            j = i + 1;  // a letter, or the one non-letter allowed in front of letters
            while (kind<MARKS>(s, j) == PRE_LETTER) ++j;
        } else if (k == PRE_NUMBER) {
            j = i + 1;
            while (j < i + DIGITS && kind<MARKS>(s, j) == PRE_NUMBER) ++j;
        } else if (kind<MARKS>(s, i + sp) == PRE_OTHER) {
            j = i + sp;
            while (kind<MARKS>(s, j) == PRE_OTHER) ++j;
            while (s.newline(j)) ++j;
        } else {
            size_t after_newline = i;  // \s*[\r\n]+ ends after the run's last newline
            for (j = i; kind<MARKS>(s, j) == PRE_SPACE; ++j) {
                if (s.newline(j)) after_newline = j + 1;
            }
            j = after_newline > i ? after_newline : match_spaces(s, i);
        }
        ends.push_back(j);
        i = j;
    }
}

// \p{N}: every number code point is a word; so is each stretch between them.
void split_numbers(const Span &s, std::vector<size_t> &ends) {
    for (size_t i = s.begin; i < s.end;) {
        size_t j = i + 1;
        if (!(s.u[i].flags & CPT_NUMBER)) {
            while (j < s.end && !(s.u[j].flags & CPT_NUMBER)) ++j;
        }
        ends.push_back(j);
        i = j;
    }
}

// [^\n]+|[\n]+
void split_newlines(const Span &s, std::vector<size_t> &ends) {
    for (size_t i = s.begin; i < s.end;) {
        const bool nl = s.cpt(i) == '\n';
        size_t j = i + 1;
        while (j < s.end && (s.cpt(j) == '\n') == nl) ++j;
        ends.push_back(j);
        i = j;
    }
}

// \s+$: the whitespace that ends a word is a word of its own. (Written out
// because a backtracking search for it is quadratic in a long run of spaces
// followed by anything else.)
void split_trailing_spaces(const Span &s, std::vector<size_t> &ends) {
    size_t start = s.end;
    while (start > s.begin && (s.u[start - 1].flags & CPT_SPACE)) --start;
    if (start > s.begin) ends.push_back(start);
    ends.push_back(s.end);
}

using Splitter = void (*)(const Span &, std::vector<size_t> &);

// Patterns, spelled as llama.cpp spells them (the hand-written splitters are
// found by comparing pattern text, so these must stay byte-identical).
#define CONTRACTIONS R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
const char *const GPT2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const char *const LLAMA3 =
    CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char *const QWEN2 =
    CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char *const QWEN35 =
    CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char *const NUMBERS = R"(\p{N})";
const char *const NEWLINES = R"([^\n]+|[\n]+)";
const char *const TRAILING_SPACES = R"(\s+$)";
const char *const BLOOM = R"( ?[^(\s|.,!?…。，、।۔،)]+)";
const char *const CJK = R"([一-龥ࠀ-一가-퟿]+)";
// Tekken and GPT-4o separate case runs with lookaheads (so, as in llama.cpp,
// only ASCII letters have a case).
#define CASED_WORDS(SUFFIX)                                                         \
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+)" SUFFIX \
    R"(|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*)" SUFFIX
const char *const TEKKEN = CASED_WORDS("") R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char *const GPT4O =
    CASED_WORDS(CONTRACTIONS "?") R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const struct {
    const char *pattern;
    Splitter split;
} k_splitters[] = {
    {GPT2, split_gpt2},
    {LLAMA3, split_llama3<3, false>},
    {QWEN2, split_llama3<1, false>},
    {QWEN35, split_llama3<1, true>},
    {NUMBERS, split_numbers},
    {NEWLINES, split_newlines},
    {TRAILING_SPACES, split_trailing_spaces},
};

struct Row {
    const char *names;  // the tokenizer.ggml.pre values, space-separated
    uint8_t options;
    const char *passes[6];
};

// The pre-tokenizers, each as llama.cpp applies it.
const Row k_rows[] = {
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
     PRE_IGNORE_MERGES | PRE_ADD_BOS, {LLAMA3}},
    {"dbrx smaug-bpe", 0, {LLAMA3}},
    {"chatglm-bpe", PRE_NO_BOS, {LLAMA3}},
    {"glm4 glm5", PRE_NO_BOS | PRE_IGNORE_MERGES, {LLAMA3}},
    {"jais-2", 0,
     {CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|)"
                   R"(\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|)"
                   R"(\s{1,2}(?!\S)|\s{1})"}},
    {"deepseek-llm", 0,
     {R"([\r\n])",
      // (written as bytes: the class holds characters that Unicode normalization would change)
      "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA\xC6\xBC-\xC6\xBF\xC7\x84-"
      "\xCA\x93\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3\xCD\xB6\xCD\xB7\xCD\xBB-"
      "\xCD\xBD\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A\xCE\x8C\xCE\x8E-\xCE\xA1\xCE\xA3-\xCF\xB5\xCF\xB7-"
      "\xD2\x81\xD2\x8A-\xD4\xAF\xD4\xB1-\xD5\x96\xE1\x82\xA0-\xE1\x83\x85\xE1\x8E\xA0-"
      "\xE1\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-\xE1\xB2\xBA\xE1\xB2\xBD-"
      "\xE1\xB2\xBF\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-\xE1\xB5\xB7\xE1\xB5\xB9-"
      "\xE1\xB6\x9A\xE1\xB8\x80-\xE1\xBC\x95\xE1\xBC\x98-\xE1\xBC\x9D\xE1\xBC\xA0-"
      "\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D\xE1\xBD\x90-"
      "\xE1\xBD\x97\xE1\xBD\x99\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-\xE1\xBD\xBD\xE1\xBE\x80-"
      "\xE1\xBE\xB4\xE1\xBE\xB6-\xE1\xBE\xBC\xE1\xBE\xBE\xE1\xBF\x82-\xE1\xBF\x84\xE1\xBF\x86-"
      "\xE1\xBF\x8C\xE1\xBF\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1\xBF\xA0-"
      "\xE1\xBF\xAC\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-"
      "\xE1\xBF\xBC\xE2\x84\x82\xE2\x84\x87\xE2\x84\x8A-\xE2\x84\x93\xE2\x84\x95\xE2\x84\x99-"
      "\xE2\x84\x9D\xE2\x84\xA4\xE2\x84\xA6\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84\xAD\xE2\x84\xAF-"
      "\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC-\xE2\x84\xBF\xE2\x85\x85-"
      "\xE2\x85\x89\xE2\x85\x8E\xE2\x86\x83\xE2\x86\x84\xE2\xB0\x80-\xE2\xB1\xBB\xE2\xB1\xBE-"
      "\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE\xE2\xB3\xB2\xE2\xB3\xB3\xEA\x99\x80-"
      "\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B\xEA\x9C\xA2-\xEA\x9D\xAF\xEA\x9D\xB1-"
      "\xEA\x9E\x87\xEA\x9E\x8B-\xEA\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-"
      "\xEF\xAC\x86\xEF\xAC\x93-\xEF\xAC\x97\xEF\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-"
      "\xEF\xBD\x9A\xF0\x90\x90\x80-\xF0\x90\x91\x8F\xF0\x90\x92\xB0-\xF0\x90\x93\x93\xF0\x90\x93\x98-"
      "\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2\xF0\x90\xB3\x80-"
      "\xF0\x90\xB3\xB2\xF0\x91\xA2\xA0-\xF0\x91\xA3\x9F\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+",
      R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)", TRAILING_SPACES, CJK, R"(\p{N}+)"}},
    {"deepseek-coder", 0, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", CJK, NUMBERS}},
    {"deepseek-v3 hunyuan-dense joyai-llm hy_v4", 0,
     {R"(\p{N}{1,3})", R"([一-龥぀-ゟ゠-ヿ]+)",
      R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
      R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {"falcon", 0, {R"([\p{P}\$\+<=>\^~\|`]+)", GPT2, R"([0-9][0-9][0-9])"}},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", 0, {NUMBERS, GPT2}},
    {"gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert mpt olmo jais "
     "trillion granite-docling exaone4",
     0, {GPT2}},
    {"qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2", 0, {QWEN2}},
    {"qwen35", 0, {QWEN35}},
    {"ufakzeka", 0, {R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {"laguna", 0, {NEWLINES, QWEN2}},
    {"poro-chat bloom gpt3-finnish", 0, {BLOOM}},
    {"viking", 0, {BLOOM, NUMBERS}},
    {"tekken", PRE_IGNORE_MERGES | PRE_ADD_BOS, {TEKKEN}},
    {"gpt-4o llama4 kanana2 talkie minimax-m2", 0, {GPT4O}},
    {"chameleon", PRE_ADD_BOS,
     {R"(<sentinel:[0-9]+>)", R"((IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z)", R"(([\t\n]|    |  ))", NUMBERS,
      R"([\p{P}!-/:-@\[-`{-~])", GPT2}},
    {"bailingmoe bailingmoe2 llada-moe", 0,
     {R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
      R"(\s*[\r\n]|\s+(?!\S)|\s+)"}},
    {"seed-coder", 0,
     {CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {"exaone-moe", 0,
     {CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|)"
                   R"(\s*[\r\n]|\s+(?!\S)|\s+)"}},
    {"minicpm5", PRE_IGNORE_MERGES,
     {R"(\p{N}{1,3})",
      CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
    {"gemma4 granite-embed-multi-311m", PRE_RAW_UTF8, {NEWLINES}},
    {"default", 0, {R"([\p{P}\$\+<=>\^~\|]+)", GPT2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
};

bool row_names(const Row &row, std::string_view name) {
    std::string_view names = row.names;
    while (!names.empty()) {
        const size_t sp = names.find(' ');
        if (names.substr(0, sp) == name) return true;
        names = sp == names.npos ? std::string_view() : names.substr(sp + 1);
    }
    return false;
}

// The views of regex.h: what std::regex sees of each unit in llama.cpp.
uint32_t collapsed_view(const PreUnit &u) {
    if (u.cpt < 128) return u.cpt;
    const uint8_t f = u.flags;
    if (f & CPT_SPACE) return VIEW_SPACE;
    if (f & CPT_NUMBER) return VIEW_NUMBER;
    if (f & CPT_LETTER) return VIEW_LETTER;
    if (f & CPT_PUNCT) return VIEW_PUNCT;
    if (f & CPT_MARK) return VIEW_MARK;
    if (f & CPT_SYMBOL) return VIEW_SYMBOL;
    return VIEW_OTHER;
}

uint32_t wide_view(const PreUnit &u) {
    if (u.cpt < 128) return u.cpt;
    if (u.flags & CPT_SPACE) return VIEW_SPACE;
    return u.cpt == CPT_INVALID ? 0xFFFD : u.cpt;
}

}  // namespace

struct PreTokenizer::Pass {
    Splitter split = nullptr;      // a hand-written splitter, or
    std::unique_ptr<Regex> regex;  // the pattern run by regex.h
};

PreTokenizer::~PreTokenizer() = default;

bool pre_units(std::string_view text, std::vector<PreUnit> &out) {
    static const uint8_t replacement_flags = cpt_flags(0xFFFD);
    bool invalid = false;
    out.clear();
    for (size_t off = 0; off < text.size();) {
        const Utf8Char c = utf8_decode(text.data() + off, text.size() - off);
        invalid |= c.cpt == CPT_INVALID;
        const uint8_t f = c.cpt == CPT_INVALID ? replacement_flags : cpt_flags(c.cpt);
        const PreKind k = (f & CPT_SPACE)    ? PRE_SPACE
                          : (f & CPT_LETTER) ? PRE_LETTER
                          : (f & CPT_NUMBER) ? PRE_NUMBER
                                             : PRE_OTHER;  // punctuation, symbols, marks, controls, unassigned
        out.push_back({off, c.cpt, f, k});
        off += c.len;
    }
    return invalid;
}

std::unique_ptr<PreTokenizer> PreTokenizer::create(std::string_view name, std::string *error) {
    for (const Row &row : k_rows) {
        if (!row_names(row, name)) continue;
        std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
        pre->options_ = row.options;
        for (const char *pattern : row.passes) {
            if (pattern == nullptr) break;
            Pass pass;
            for (const auto &s : k_splitters) {
                if (std::string_view(s.pattern) == pattern) pass.split = s.split;
            }
            if (pass.split == nullptr) {
                std::string why;
                pass.regex = Regex::compile(pattern, &why);
                if (!pass.regex) {  // a bug in the table above, reported rather than hidden
                    if (error) *error = "pre-tokenizer '" + std::string(name) + "': " + why;
                    return nullptr;
                }
            }
            pre->passes_.push_back(std::move(pass));
        }
        return pre;
    }
    if (error) {
        std::string known;
        for (const Row &row : k_rows) known += std::string(known.empty() ? "" : " ") + row.names;
        *error = "unsupported pre-tokenizer '" + std::string(name.substr(0, 40)) + "' (supported: " + known + ")";
    }
    return nullptr;
}

void PreTokenizer::split(const std::vector<PreUnit> &units, std::vector<size_t> &ends) const {
    std::vector<size_t> words{units.size()}, next;
    std::vector<uint32_t> view;
    bool view_collapsed = false;
    std::vector<uint64_t> stack;
    for (const Pass &pass : passes_) {
        next.clear();
        size_t begin = 0;
        if (pass.split) {
            for (const size_t end : words) {
                pass.split(Span{units.data(), begin, end}, next);
                begin = end;
            }
        } else {
            const bool collapsed = pass.regex->collapsed();
            if (view.empty() || view_collapsed != collapsed) {
                view.resize(units.size());
                for (size_t i = 0; i < units.size(); ++i) {
                    view[i] = collapsed ? collapsed_view(units[i]) : wide_view(units[i]);
                }
                view_collapsed = collapsed;
            }
            // As std::regex_iterator: the leftmost match, then the next one after it;
            // the stretches between matches are words too. An empty match counts as none.
            for (const size_t end : words) {
                size_t gap = begin;
                for (size_t i = begin; i < end;) {
                    const size_t m = pass.regex->match_at(view.data(), end, i, stack);
                    if (m == SIZE_MAX || m == i) {
                        ++i;
                        continue;
                    }
                    if (i > gap) next.push_back(i);
                    next.push_back(m);
                    gap = i = m;
                }
                if (end > gap) next.push_back(end);
                begin = end;
            }
        }
        words.swap(next);
    }
    if (units.empty()) words.clear();
    ends.swap(words);
}

}  // namespace llmd
