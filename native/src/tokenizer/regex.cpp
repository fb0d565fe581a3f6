#include "tokenizer/regex.h"

#include "tokenizer/unicode.h"

#include <algorithm>
#include <climits>

namespace llmd {

// Parse tree. Kept tiny: a pattern is compiled once per vocabulary.
struct Regex::Node {
    enum Kind { ALT, SEQ, REPEAT, CLASS, LOOK, END } kind;
    std::vector<Node> kids;
    int32_t cls = -1;          // CLASS
    int32_t min = 0, max = 0;  // REPEAT; max < 0: unbounded
    bool negate = false;       // LOOK
};

namespace {

struct Parser {
    std::string_view p;
    size_t i = 0;
    bool collapsed;
    std::vector<std::pair<std::vector<std::pair<uint32_t, uint32_t>>, bool>> classes;
    std::string error;

    bool done() const { return i >= p.size(); }
    char peek() const { return done() ? '\0' : p[i]; }

    bool fail(const std::string &why) {
        if (error.empty()) error = why + " at offset " + std::to_string(i);
        return false;
    }

    uint32_t next_cpt() {
        const Utf8Char c = utf8_decode(p.data() + i, p.size() - i);
        i += c.len;
        return c.cpt;
    }

    // \p{X} as view ranges: the placeholder and the ASCII members of X.
    bool category(std::string_view name, std::vector<std::pair<uint32_t, uint32_t>> &out) {
        uint8_t flag;
        uint32_t placeholder;
        if (name == "N") {
            flag = CPT_NUMBER, placeholder = VIEW_NUMBER;
        } else if (name == "L" || name == "Lu" || name == "Ll" || name == "Lt" || name == "Lm" || name == "Lo") {
            flag = CPT_LETTER, placeholder = VIEW_LETTER;
        } else if (name == "P") {
            flag = CPT_PUNCT, placeholder = VIEW_PUNCT;
        } else if (name == "M") {
            flag = CPT_MARK, placeholder = VIEW_MARK;
        } else if (name == "S") {
            flag = CPT_SYMBOL, placeholder = VIEW_SYMBOL;
        } else {
            return fail("unsupported category \\p{" + std::string(name) + "}");
        }
        out.push_back({placeholder, placeholder});
        for (uint32_t c = 0; c < 128; ++c) {
            if (cpt_flags(c) & flag) out.push_back({c, c});
        }
        return true;
    }

    static void spaces(std::vector<std::pair<uint32_t, uint32_t>> &out) {
        out.push_back({0x09, 0x0D});
        out.push_back({0x20, 0x20});
    }

    // An escape after '\': appends its ranges; sets *single to its code point
    // when it stands for one character (so it may start a range).
    bool escape(std::vector<std::pair<uint32_t, uint32_t>> &out, bool *negated, uint32_t *single) {
        *negated = false;
        *single = UINT32_MAX;
        if (done()) return fail("pattern ends in a backslash");
        const char c = p[i++];
        switch (c) {
            case 's': spaces(out); return true;
            case 'S': spaces(out); *negated = true; return true;
            case 'd': out.push_back({'0', '9'}); return true;
            case 'r': *single = '\r'; break;
            case 'n': *single = '\n'; break;
            case 't': *single = '\t'; break;
            case 'p': {
                const size_t close = p.find('}', i);
                if (peek() != '{' || close == p.npos) return fail("malformed \\p");
                const std::string_view name = p.substr(i + 1, close - i - 1);
                i = close + 1;
                if (!collapsed) return fail("\\p in a pattern without categories");
                return category(name, out);
            }
            default:
                if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
                    return fail(std::string("unsupported escape \\") + c);
                --i;
                *single = next_cpt();  // an escaped punctuation character stands for itself
                break;
        }
        out.push_back({*single, *single});
        return true;
    }

    int32_t add_class(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate) {
        classes.push_back({std::move(ranges), negate});
        return int32_t(classes.size() - 1);
    }

    bool literal_ok(uint32_t c) {
        if (c == CPT_INVALID) return fail("invalid UTF-8 in pattern");
        if (collapsed && c >= 128) return fail("non-ASCII literal in a pattern with categories");
        return true;
    }

    bool bracket(Regex::Node &out) {
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        bool negate = false;
        if (peek() == '^') {
            negate = true;
            ++i;
        }
        while (!done() && p[i] != ']') {
            uint32_t lo;
            if (p[i] == '\\') {
                ++i;
                bool neg;
                if (!escape(ranges, &neg, &lo)) return false;
                if (neg) return fail("\\S inside a class");
                if (lo == UINT32_MAX) continue;  // a class escape, no range
                ranges.pop_back();
            } else {
                lo = next_cpt();
                if (!literal_ok(lo)) return false;
            }
            uint32_t hi = lo;
            if (peek() == '-' && i + 1 < p.size() && p[i + 1] != ']') {
                ++i;
                if (p[i] == '\\') {
                    ++i;
                    std::vector<std::pair<uint32_t, uint32_t>> tmp;
                    bool neg;
                    if (!escape(tmp, &neg, &hi)) return false;
                    if (hi == UINT32_MAX) return fail("a class escape ends a range");
                } else {
                    hi = next_cpt();
                    if (!literal_ok(hi)) return false;
                }
                if (hi < lo) return fail("reversed range");
            }
            ranges.push_back({lo, hi});
        }
        if (done()) return fail("unclosed [");
        ++i;  // ']'
        out.kind = Regex::Node::CLASS;
        out.cls = add_class(std::move(ranges), negate);
        return true;
    }

    bool number(int32_t *v) {
        if (done() || p[i] < '0' || p[i] > '9') return fail("expected a number");
        int64_t n = 0;
        while (!done() && p[i] >= '0' && p[i] <= '9') {
            n = n * 10 + (p[i++] - '0');
            if (n > 1000) return fail("repeat count too large");
        }
        *v = int32_t(n);
        return true;
    }

    bool atom(Regex::Node &out) {
        const char c = p[i];
        if (c == '(') {
            ++i;
            out.kind = Regex::Node::SEQ;
            if (peek() == '?') {
                const char k = i + 1 < p.size() ? p[i + 1] : '\0';
                if (k == ':') {
                    i += 2;
                } else if (k == '=' || k == '!') {
                    i += 2;
                    out.kind = Regex::Node::LOOK;
                    out.negate = k == '!';
                } else {
                    return fail("unsupported group");
                }
            }
            Regex::Node inner;
            if (!alt(inner)) return false;
            if (peek() != ')') return fail("unclosed (");
            ++i;
            out.kids.push_back(std::move(inner));
            return true;
        }
        if (c == '[') {
            ++i;
            return bracket(out);
        }
        if (c == '$') {
            ++i;
            out.kind = Regex::Node::END;
            return true;
        }
        if (c == '.' || c == '^' || c == ')' || c == '|' || c == '*' || c == '+' || c == '?' || c == '{') {
            return fail(std::string("unsupported '") + c + "'");
        }
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        bool negate = false;
        if (c == '\\') {
            ++i;
            uint32_t single;
            if (!escape(ranges, &negate, &single)) return false;
        } else {
            const uint32_t lit = next_cpt();
            if (!literal_ok(lit)) return false;
            ranges.push_back({lit, lit});
        }
        out.kind = Regex::Node::CLASS;
        out.cls = add_class(std::move(ranges), negate);
        return true;
    }

    bool seq(Regex::Node &out) {
        out.kind = Regex::Node::SEQ;
        while (!done() && p[i] != '|' && p[i] != ')') {
            Regex::Node a;
            if (!atom(a)) return false;
            if (!done() && (p[i] == '?' || p[i] == '*' || p[i] == '+' || p[i] == '{')) {
                Regex::Node r;
                r.kind = Regex::Node::REPEAT;
                const char q = p[i++];
                if (q == '?') {
                    r.min = 0, r.max = 1;
                } else if (q == '*') {
                    r.min = 0, r.max = -1;
                } else if (q == '+') {
                    r.min = 1, r.max = -1;
                } else {
                    if (!number(&r.min)) return false;
                    r.max = r.min;
                    if (peek() == ',') {
                        ++i;
                        r.max = -1;
                        if (peek() != '}' && !number(&r.max)) return false;
                    }
                    if (peek() != '}') return fail("unclosed {");
                    ++i;
                    if (r.max >= 0 && r.max < r.min) return fail("reversed repeat");
                }
                if (peek() == '?' || peek() == '+') return fail("lazy or possessive quantifier");
                r.kids.push_back(std::move(a));
                out.kids.push_back(std::move(r));
            } else {
                out.kids.push_back(std::move(a));
            }
        }
        return true;
    }

    bool alt(Regex::Node &out) {
        Regex::Node first;
        if (!seq(first)) return false;
        if (peek() != '|') {
            out = std::move(first);
            return true;
        }
        out.kind = Regex::Node::ALT;
        out.kids.push_back(std::move(first));
        while (peek() == '|') {
            ++i;
            Regex::Node next;
            if (!seq(next)) return false;
            out.kids.push_back(std::move(next));
        }
        return true;
    }
};

// As llama.cpp decides it: a pattern naming any of these is matched collapsed.
bool names_category(std::string_view pattern) {
    for (const char *cat : {"\\p{N}", "\\p{L}", "\\p{P}", "\\p{M}", "\\p{S}", "\\p{Lu}", "\\p{Ll}", "\\p{Lt}",
                            "\\p{Lm}", "\\p{Lo}"}) {
        if (pattern.find(cat) != pattern.npos) return true;
    }
    return false;
}

}  // namespace

Regex::~Regex() = default;

std::unique_ptr<Regex> Regex::compile(std::string_view pattern, std::string *error) {
    Parser parser{pattern, 0, names_category(pattern), {}, {}};
    Node root;
    if (!parser.alt(root) || !parser.done()) {
        if (error) *error = parser.error.empty() ? "unbalanced )" : parser.error;
        return nullptr;
    }
    std::unique_ptr<Regex> re(new Regex());
    re->collapsed_ = parser.collapsed;
    for (auto &c : parser.classes) {
        Class cls;
        cls.ranges = std::move(c.first);
        cls.negate = c.second;
        re->classes_.push_back(std::move(cls));
    }
    re->emit(root);
    re->prog_.push_back({OP_MATCH, false, 0, 0});
    return re;
}

// Appends the code of `node`. Alternatives and repeats become SPLITs whose
// preferred branch is the one ECMAScript tries first.
void Regex::emit(const Node &node) {
    switch (node.kind) {
        case Node::CLASS:
            prog_.push_back({OP_CLASS, false, node.cls, 0});
            break;
        case Node::END:
            prog_.push_back({OP_END, false, 0, 0});
            break;
        case Node::SEQ:
            for (const Node &k : node.kids) emit(k);
            break;
        case Node::ALT: {
            std::vector<size_t> jumps;
            for (size_t k = 0; k < node.kids.size(); ++k) {
                const bool last = k + 1 == node.kids.size();
                const size_t split = prog_.size();
                if (!last) prog_.push_back({OP_SPLIT, false, int32_t(split + 1), 0});
                emit(node.kids[k]);
                if (!last) {
                    jumps.push_back(prog_.size());
                    prog_.push_back({OP_JMP, false, 0, 0});
                    prog_[split].b = int32_t(prog_.size());
                }
            }
            for (const size_t j : jumps) prog_[j].a = int32_t(prog_.size());
            break;
        }
        case Node::REPEAT: {
            const Node &body = node.kids[0];
            for (int32_t k = 0; k < node.min; ++k) emit(body);
            if (node.max < 0) {  // body*: loop
                const size_t split = prog_.size();
                prog_.push_back({OP_SPLIT, false, int32_t(split + 1), 0});
                emit(body);
                prog_.push_back({OP_JMP, false, int32_t(split), 0});
                prog_[split].b = int32_t(prog_.size());
            } else {  // up to max - min optional copies, each entered only after the previous
                std::vector<size_t> splits;
                for (int32_t k = node.min; k < node.max; ++k) {
                    splits.push_back(prog_.size());
                    prog_.push_back({OP_SPLIT, false, int32_t(prog_.size() + 1), 0});
                    emit(body);
                }
                for (const size_t s : splits) prog_[s].b = int32_t(prog_.size());
            }
            break;
        }
        case Node::LOOK: {
            // The sub-program follows; on success the machine continues past it.
            const size_t look = prog_.size();
            prog_.push_back({OP_LOOK, node.negate, int32_t(look + 1), 0});
            emit(node.kids[0]);
            prog_.push_back({OP_MATCH, false, 0, 0});
            prog_[look].b = int32_t(prog_.size());
            break;
        }
    }
}

bool Regex::Class::has(uint32_t v) const {
    bool in = false;
    for (const auto &r : ranges) {
        if (v >= r.first && v <= r.second) {
            in = true;
            break;
        }
    }
    return in != negate;
}

// The backtracking machine. Each stack entry is a (pc, position) to resume
// from when the current path fails; entries below `base` belong to a caller
// (a lookahead runs on the same stack).
bool Regex::run(int32_t pc, const uint32_t *view, size_t n, size_t start, size_t *end,
                std::vector<uint64_t> &stack) const {
    const size_t base = stack.size();
    stack.push_back((uint64_t(uint32_t(pc)) << 32) | start);
    while (stack.size() > base) {
        const uint64_t top = stack.back();
        stack.pop_back();
        pc = int32_t(top >> 32);
        size_t pos = size_t(uint32_t(top));
        for (bool alive = true; alive;) {
            const Inst &in = prog_[pc];
            switch (in.op) {
                case OP_CLASS:
                    if (pos < n && classes_[in.a].has(view[pos])) {
                        ++pc, ++pos;
                    } else {
                        alive = false;
                    }
                    break;
                case OP_SPLIT:
                    stack.push_back((uint64_t(uint32_t(in.b)) << 32) | pos);
                    pc = in.a;
                    break;
                case OP_JMP:
                    pc = in.a;
                    break;
                case OP_END:
                    if (pos == n) {
                        ++pc;
                    } else {
                        alive = false;
                    }
                    break;
                case OP_LOOK: {
                    size_t unused;
                    const bool found = run(in.a, view, n, pos, &unused, stack);
                    if (found != in.negate) {
                        pc = in.b;
                    } else {
                        alive = false;
                    }
                    break;
                }
                case OP_MATCH:
                    *end = pos;
                    stack.resize(base);
                    return true;
            }
        }
    }
    return false;
}

size_t Regex::match_at(const uint32_t *view, size_t n, size_t start, std::vector<uint64_t> &stack) const {
    size_t end;
    return run(0, view, n, start, &end, stack) ? end : SIZE_MAX;
}

}  // namespace llmd
