// grammar.cpp — see grammar.h.
#include "decode/grammar.h"

#include "tokenizer/vocab.h"

#include <algorithm>
#include <functional>
#include <queue>

namespace llmd {

namespace {

// Reads the tokens of the grammar text; every method fails instead of reading past the end.
struct Reader {
    std::string_view text;
    size_t pos = 0;

    bool at_end() const { return pos >= text.size(); }
    char peek() const { return at_end() ? '\0' : text[pos]; }
    bool eat(char c) {
        if (at_end() || text[pos] != c) return false;
        ++pos;
        return true;
    }
    bool literal(std::string_view word) {
        if (text.substr(pos, word.size()) != word) return false;
        pos += word.size();
        return true;
    }
    bool decimal(uint32_t *out) {
        uint64_t v = 0;
        size_t digits = 0;
        while (!at_end() && text[pos] >= '0' && text[pos] <= '9') {
            v = v * 10 + static_cast<uint64_t>(text[pos++] - '0');
            if (++digits > 10 || v > UINT32_MAX) return false;
        }
        *out = static_cast<uint32_t>(v);
        return digits > 0;
    }
    bool hex_byte(uint8_t *out) {
        unsigned v = 0, digits = 0;
        for (; !at_end() && digits < 2; ++digits, ++pos) {
            const char c = text[pos];
            if (c >= '0' && c <= '9') v = v * 16 + static_cast<unsigned>(c - '0');
            else if (c >= 'a' && c <= 'f') v = v * 16 + static_cast<unsigned>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v = v * 16 + static_cast<unsigned>(c - 'A' + 10);
            else break;
        }
        *out = static_cast<uint8_t>(v);
        return digits > 0;
    }
};

constexpr uint64_t kFar = UINT64_MAX;

} // namespace

// ---- Grammar ------------------------------------------------------------------

std::unique_ptr<const Grammar> Grammar::parse(std::string_view text, std::string *error) {
    auto fail = [&](std::string why) -> std::unique_ptr<const Grammar> {
        *error = std::move(why);
        return nullptr;
    };
    Reader r{text};
    uint32_t n = 0, start = 0;
    if (!r.literal("llmd-grammar 1 ") || !r.decimal(&n) || !r.eat(' ') || !r.decimal(&start) || !r.eat('\n'))
        return fail("the header is not 'llmd-grammar 1 <states> <start>'");
    if (n == 0 || n > kMaxStates) return fail("the state count must be 1.." + std::to_string(kMaxStates));
    if (start >= n) return fail("the start state is out of range");

    auto g = std::make_unique<Grammar>();
    g->start_ = start;
    g->states_.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
        State &st = g->states_[i];
        st.range_begin = static_cast<uint32_t>(g->ranges_.size());
        st.call_begin = static_cast<uint32_t>(g->calls_.size());
        st.token_begin = static_cast<uint32_t>(g->tokens_.size());
        const std::string where = "state " + std::to_string(i) + ": ";
        while (!r.at_end() && r.peek() != '\n') {
            if (r.eat('$')) {
                st.accept = true;
            } else if (r.eat('@')) {
                Call c{};
                if (!r.decimal(&c.callee) || !r.eat('>') || !r.decimal(&c.ret)) return fail(where + "a call is not '@C>R'");
                if (c.callee >= n || c.ret >= n) return fail(where + "a call names a state out of range");
                g->calls_.push_back(c);
            } else if (r.eat('t')) {
                uint32_t id = 0;
                TokenEdge te{};
                if (!r.decimal(&id) || !r.eat('>') || !r.decimal(&te.target)) return fail(where + "a token edge is not 'tID>T'");
                if (id > INT32_MAX || te.target >= n) return fail(where + "a token edge's id or target is out of range");
                te.id = static_cast<int32_t>(id);
                g->tokens_.push_back(te);
            } else {
                Range rg{};
                if (!r.hex_byte(&rg.lo)) return fail(where + "unexpected character");
                rg.hi = rg.lo;
                if (r.eat('-') && !r.hex_byte(&rg.hi)) return fail(where + "a byte range is not 'LO-HI>T'");
                if (!r.eat('>') || !r.decimal(&rg.target)) return fail(where + "a byte range lacks '>T'");
                if (rg.hi < rg.lo || rg.target >= n) return fail(where + "a byte range is empty or its target is out of range");
                g->ranges_.push_back(rg);
            }
            if (g->ranges_.size() + g->calls_.size() + g->tokens_.size() > kMaxEdges) return fail("the grammar has too many edges");
            if (!r.eat(' ') && !r.at_end() && r.peek() != '\n') return fail(where + "items must be separated by one space");
        }
        if (!r.eat('\n')) return fail("the text has fewer state lines than the header says (each ends with a newline)");
        st.range_end = static_cast<uint32_t>(g->ranges_.size());
        st.call_end = static_cast<uint32_t>(g->calls_.size());
        st.token_end = static_cast<uint32_t>(g->tokens_.size());
        auto tfirst = g->tokens_.begin() + st.token_begin, tlast = g->tokens_.begin() + st.token_end;
        std::sort(tfirst, tlast, [](const TokenEdge &a, const TokenEdge &b) { return a.id < b.id; });
        if (std::adjacent_find(tfirst, tlast, [](const TokenEdge &a, const TokenEdge &b) { return a.id == b.id; }) != tlast)
            return fail(where + "a token id has two edges (the state must be deterministic)");
        auto first = g->ranges_.begin() + st.range_begin, last = g->ranges_.begin() + st.range_end;
        std::sort(first, last, [](const Range &a, const Range &b) { return a.lo < b.lo; });
        for (auto it = first; it != last && it + 1 != last; ++it)
            if ((it + 1)->lo <= it->hi) return fail(where + "byte ranges overlap (the state must be deterministic)");
    }
    if (!r.at_end()) return fail("the text has more state lines than the header says");
    if (!g->compute_min_bytes(error)) return nullptr;
    g->drop_dead_edges();
    if (!g->check_left_recursion(error)) return nullptr;
    for (const TokenEdge &te : g->tokens_) g->token_ids_.push_back(te.id);
    std::sort(g->token_ids_.begin(), g->token_ids_.end());
    g->token_ids_.erase(std::unique(g->token_ids_.begin(), g->token_ids_.end()), g->token_ids_.end());
    return g;
}

uint32_t Grammar::next(uint32_t s, uint8_t b) const {
    const State &st = states_[s];
    for (uint32_t i = st.range_begin; i < st.range_end; ++i) {
        const Range &rg = ranges_[i];
        if (b < rg.lo) break;
        if (b <= rg.hi) return rg.target;
    }
    return kNone;
}

uint32_t Grammar::next_token(uint32_t s, int32_t id) const {
    const State &st = states_[s];
    for (uint32_t i = st.token_begin; i < st.token_end; ++i)
        if (tokens_[i].id == id) return tokens_[i].target;
    return kNone;
}

// Shortest distances to acceptance. A call's cost is the sum of its callee's and
// its return state's, so this is Knuth's generalisation of Dijkstra: a state is
// final when popped, and a call edge is relaxed once both its ends are final.
bool Grammar::compute_min_bytes(std::string *error) {
    const uint32_t n = size();
    // Reverse adjacency in CSR form: byte (and token) predecessors of each state, and the
    // call edges in which each state is the callee or the return state.
    std::vector<uint32_t> pred_off(n + 1, 0), watch_off(n + 1, 0), call_owner(calls_.size());
    for (uint32_t s = 0; s < n; ++s) {
        for (uint32_t i = states_[s].range_begin; i < states_[s].range_end; ++i) ++pred_off[ranges_[i].target + 1];
        for (uint32_t i = states_[s].token_begin; i < states_[s].token_end; ++i) ++pred_off[tokens_[i].target + 1];
        for (uint32_t k = states_[s].call_begin; k < states_[s].call_end; ++k) {
            call_owner[k] = s;
            ++watch_off[calls_[k].callee + 1];
            if (calls_[k].ret != calls_[k].callee) ++watch_off[calls_[k].ret + 1];
        }
    }
    for (uint32_t s = 0; s < n; ++s) {
        pred_off[s + 1] += pred_off[s];
        watch_off[s + 1] += watch_off[s];
    }
    std::vector<uint32_t> pred(pred_off[n]), watch(watch_off[n]);
    std::vector<uint32_t> pred_fill(pred_off.begin(), pred_off.end() - 1), watch_fill(watch_off.begin(), watch_off.end() - 1);
    for (uint32_t s = 0; s < n; ++s) {
        for (uint32_t i = states_[s].range_begin; i < states_[s].range_end; ++i) pred[pred_fill[ranges_[i].target]++] = s;
        for (uint32_t i = states_[s].token_begin; i < states_[s].token_end; ++i) pred[pred_fill[tokens_[i].target]++] = s;
        for (uint32_t k = states_[s].call_begin; k < states_[s].call_end; ++k) {
            watch[watch_fill[calls_[k].callee]++] = k;
            if (calls_[k].ret != calls_[k].callee) watch[watch_fill[calls_[k].ret]++] = k;
        }
    }

    std::vector<uint64_t> dist(n, kFar);
    std::vector<char> done(n, 0);
    using Item = std::pair<uint64_t, uint32_t>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
    auto relax = [&](uint32_t s, uint64_t d) {
        if (d < dist[s]) {
            dist[s] = d;
            queue.push({d, s});
        }
    };
    for (uint32_t s = 0; s < n; ++s)
        if (states_[s].accept) relax(s, 0);
    while (!queue.empty()) {
        const auto [d, s] = queue.top();
        queue.pop();
        if (done[s]) continue;
        done[s] = 1;
        for (uint32_t i = pred_off[s]; i < pred_off[s + 1]; ++i) relax(pred[i], d + 1);
        for (uint32_t i = watch_off[s]; i < watch_off[s + 1]; ++i) {
            const Call &c = calls_[watch[i]];
            if (done[c.callee] && done[c.ret]) relax(call_owner[watch[i]], dist[c.callee] + dist[c.ret]);
        }
    }
    if (dist[start_] == kFar) {
        *error = "the grammar accepts nothing";
        return false;
    }
    min_bytes_.resize(n);
    for (uint32_t s = 0; s < n; ++s) min_bytes_[s] = static_cast<uint32_t>(std::min<uint64_t>(dist[s], kInfinite));
    return true;
}

// Edges into states that cannot finish only lead the sampler into dead ends.
void Grammar::drop_dead_edges() {
    auto live = [&](uint32_t s) { return min_bytes_[s] != kInfinite; };
    std::vector<Range> ranges;
    std::vector<Call> calls;
    std::vector<TokenEdge> tokens;
    for (State &st : states_) {
        const uint32_t rb = static_cast<uint32_t>(ranges.size()), cb = static_cast<uint32_t>(calls.size());
        const uint32_t tb = static_cast<uint32_t>(tokens.size());
        for (uint32_t i = st.token_begin; i < st.token_end; ++i)
            if (live(tokens_[i].target)) tokens.push_back(tokens_[i]);
        for (uint32_t i = st.range_begin; i < st.range_end; ++i)
            if (live(ranges_[i].target)) ranges.push_back(ranges_[i]);
        for (uint32_t k = st.call_begin; k < st.call_end; ++k)
            if (live(calls_[k].callee) && live(calls_[k].ret)) calls.push_back(calls_[k]);
        st.range_begin = rb;
        st.range_end = static_cast<uint32_t>(ranges.size());
        st.call_begin = cb;
        st.call_end = static_cast<uint32_t>(calls.size());
        st.token_begin = tb;
        st.token_end = static_cast<uint32_t>(tokens.size());
    }
    ranges_ = std::move(ranges);
    calls_ = std::move(calls);
    tokens_ = std::move(tokens);
}

// Moves that read no byte: a call pushes a frame (s -> callee), and a call of a
// callee that may accept at once also leads on to its return state (s -> ret).
// A cycle through a push would let closure push frames forever: refused. This is
// Tarjan's strongly connected components, iterative so no input can overflow the
// C++ stack.
bool Grammar::check_left_recursion(std::string *error) const {
    const uint32_t n = size();
    auto edges = [&](uint32_t s, std::vector<uint32_t> &out) {
        out.clear();
        for (const Call *c = calls_begin(s); c != calls_end(s); ++c) {
            out.push_back(c->callee);
            if (min_bytes_[c->callee] == 0) out.push_back(c->ret);
        }
    };
    constexpr uint32_t kUnseen = UINT32_MAX;
    std::vector<uint32_t> index(n, kUnseen), low(n, 0), comp(n, kUnseen), stack;
    std::vector<char> on_stack(n, 0);
    struct Frame {
        uint32_t s;
        std::vector<uint32_t> next;
        size_t i;
    };
    std::vector<Frame> frames;
    uint32_t counter = 0, n_comp = 0;
    for (uint32_t root = 0; root < n; ++root) {
        if (index[root] != kUnseen || calls_begin(root) == calls_end(root)) continue;
        frames.push_back({root, {}, 0});
        edges(root, frames.back().next);
        index[root] = low[root] = counter++;
        stack.push_back(root);
        on_stack[root] = 1;
        while (!frames.empty()) {
            Frame &f = frames.back();
            if (f.i < f.next.size()) {
                const uint32_t t = f.next[f.i++];
                if (index[t] == kUnseen) {
                    index[t] = low[t] = counter++;
                    stack.push_back(t);
                    on_stack[t] = 1;
                    frames.push_back({t, {}, 0});
                    edges(t, frames.back().next);
                } else if (on_stack[t]) {
                    low[f.s] = std::min(low[f.s], index[t]);
                }
                continue;
            }
            const uint32_t s = f.s;
            if (low[s] == index[s]) {
                uint32_t t;
                do {
                    t = stack.back();
                    stack.pop_back();
                    on_stack[t] = 0;
                    comp[t] = n_comp;
                } while (t != s);
                ++n_comp;
            }
            frames.pop_back();
            if (!frames.empty()) low[frames.back().s] = std::min(low[frames.back().s], low[s]);
        }
    }
    for (uint32_t s = 0; s < n; ++s)
        for (const Call *c = calls_begin(s); c != calls_end(s); ++c)
            if (comp[s] != kUnseen && comp[s] == comp[c->callee]) {
                *error = "left recursion: state " + std::to_string(s) + " reaches itself through calls without reading a byte";
                return false;
            }
    return true;
}

// ---- TokenTrie --------------------------------------------------------------------

TokenTrie::TokenTrie(const Vocab &vocab, const std::vector<int32_t> &eog_ids) {
    constexpr size_t kMaxPiece = 1024; // longer tokens are never allowed (depth is 16-bit, walks stay shallow)
    const int32_t n = vocab.size();
    pieces_.resize(n);
    eog_.assign(n, 0);
    for (const int32_t id : eog_ids)
        if (id >= 0 && id < n && !eog_[id]) {
            eog_[id] = 1;
            eog_ids_.push_back(id);
        }
    std::vector<int32_t> order;
    for (int32_t id = 0; id < n; ++id) {
        if (vocab.is_control(id) || eog_[id]) continue; // an end-of-generation id ends, it writes nothing
        const std::string_view p = vocab.piece(id);
        if (p.empty() || p.size() > kMaxPiece) continue;
        pieces_[id] = p;
        order.push_back(id);
    }
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pieces_[a] < pieces_[b]; });

    // Sorted pieces are a preorder: each piece reuses the open path of its
    // predecessor up to their common prefix and opens nodes for the rest.
    std::vector<uint32_t> path;
    std::string_view prev;
    for (const int32_t id : order) {
        const std::string_view p = pieces_[id];
        size_t common = 0;
        while (common < p.size() && common < prev.size() && p[common] == prev[common]) ++common;
        while (path.size() > common) {
            nodes_[path.back()].end = static_cast<uint32_t>(nodes_.size());
            path.pop_back();
        }
        for (size_t k = common; k < p.size(); ++k) {
            path.push_back(static_cast<uint32_t>(nodes_.size()));
            nodes_.push_back(Node{static_cast<uint8_t>(p[k]), static_cast<uint16_t>(k + 1), 0, 0, 0});
        }
        Node &last = nodes_[path.back()];
        if (last.tok_end == last.tok_begin) last.tok_begin = static_cast<uint32_t>(ids_.size());
        ids_.push_back(id); // equal pieces are adjacent in `order`, so a node's ids stay contiguous
        last.tok_end = static_cast<uint32_t>(ids_.size());
        max_depth_ = std::max(max_depth_, static_cast<int>(p.size()));
        prev = p;
    }
    for (const uint32_t i : path) nodes_[i].end = static_cast<uint32_t>(nodes_.size());
}

// ---- GrammarMatcher ----------------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::unique_ptr<const Grammar> grammar, const TokenTrie *trie, int32_t token_budget)
    : g_(std::move(grammar)), trie_(trie) {
    seen_.clear();
    closure({g_->start(), Grammar::kNone}, current_);
    budgeted_ = token_budget > 0;
    remaining_ = budgeted_ ? static_cast<uint64_t>(token_budget) : 0;
    if (trie_ != nullptr) levels_.resize(static_cast<size_t>(trie_->max_depth()) + 1);
}

void GrammarMatcher::fail(const char *why) {
    if (error_.empty()) error_ = why;
}

uint32_t GrammarMatcher::intern(uint32_t ret, uint32_t parent) {
    // Returning to a state that only accepts returns on to the parent at once:
    // a tail call needs no frame, so right recursion does not grow the stack.
    if (g_->accepts(ret) && !g_->reads_input(ret) && g_->calls_begin(ret) == g_->calls_end(ret)) return parent;
    const uint64_t k = (static_cast<uint64_t>(ret) << 32) | parent;
    if (const auto it = node_ids_.find(k); it != node_ids_.end()) return it->second;
    if (nodes_.size() >= kMaxNodes) {
        fail("the grammar needs too many stack frames");
        return Grammar::kNone;
    }
    const uint32_t depth = parent == Grammar::kNone ? 1 : nodes_[parent].depth + 1;
    const uint64_t rest = static_cast<uint64_t>(g_->min_bytes(ret)) + frame_rest(parent);
    nodes_.push_back(Node{ret, parent, depth, static_cast<uint32_t>(std::min<uint64_t>(rest, Grammar::kInfinite - 1))});
    const uint32_t id = static_cast<uint32_t>(nodes_.size() - 1);
    node_ids_.emplace(k, id);
    return id;
}

// Adds seed and everything reachable from it without reading a byte to out.
// seen_ (cleared by the caller) holds the configurations met in this step.
void GrammarMatcher::closure(Config seed, StateSet &out) {
    work_.clear();
    work_.push_back(seed);
    while (!work_.empty()) {
        const Config c = work_.back();
        work_.pop_back();
        if (std::find(seen_.begin(), seen_.end(), c) != seen_.end()) continue;
        if (seen_.size() >= kMaxConfigs) {
            fail("the grammar is too ambiguous (too many parses at once)");
            return;
        }
        seen_.push_back(c);
        if (g_->reads_input(c.state)) out.active.push_back(c);
        if (g_->accepts(c.state)) {
            if (c.stack == Grammar::kNone) {
                out.can_end = true;
            } else {
                const Node frame = nodes_[c.stack];
                work_.push_back({frame.ret, frame.parent});
            }
        }
        const uint32_t depth = c.stack == Grammar::kNone ? 0 : nodes_[c.stack].depth;
        for (const Grammar::Call *k = g_->calls_begin(c.state); k != g_->calls_end(c.state); ++k) {
            if (depth >= kMaxDepth) break;
            const uint32_t frame = intern(k->ret, c.stack);
            if (!error_.empty()) return;
            work_.push_back({k->callee, frame});
        }
    }
}

template <class Next>
void GrammarMatcher::step(const StateSet &in, Next next, StateSet &out) {
    out.active.clear();
    out.can_end = false;
    seen_.clear();
    for (const Config &c : in.active) {
        const uint32_t t = next(c.state);
        if (t != Grammar::kNone) closure({t, c.stack}, out);
    }
}

void GrammarMatcher::advance(const StateSet &in, uint8_t byte, StateSet &out) {
    step(in, [&](uint32_t s) { return g_->next(s, byte); }, out);
}

void GrammarMatcher::advance_token(const StateSet &in, int32_t id, StateSet &out) {
    step(in, [&](uint32_t s) { return g_->next_token(s, id); }, out);
}

// The set after `bytes`, in one of the scratch sets (or `in` itself for no bytes);
// nullptr if the grammar rejects them.
const GrammarMatcher::StateSet *GrammarMatcher::advance_bytes(const StateSet &in, std::string_view bytes) {
    const StateSet *from = &in;
    for (size_t i = 0; i < bytes.size(); ++i) {
        if (from->active.empty()) return nullptr;
        StateSet &to = (i % 2 == 0) ? scratch_a_ : scratch_b_;
        advance(*from, static_cast<uint8_t>(bytes[i]), to);
        from = &to;
    }
    return (from->active.empty() && !from->can_end) ? nullptr : from;
}

uint32_t GrammarMatcher::cost(const StateSet &set) const {
    if (set.can_end) return 0;
    uint64_t best = kRejected;
    for (const Config &c : set.active)
        best = std::min(best, static_cast<uint64_t>(g_->min_bytes(c.state)) + frame_rest(c.stack));
    return static_cast<uint32_t>(std::min<uint64_t>(best, kRejected));
}

std::string GrammarMatcher::key(const StateSet &set) const {
    std::vector<uint64_t> words;
    words.reserve(set.active.size());
    for (const Config &c : set.active) words.push_back((static_cast<uint64_t>(c.state) << 32) | c.stack);
    std::sort(words.begin(), words.end());
    std::string k(reinterpret_cast<const char *>(words.data()), words.size() * sizeof(uint64_t));
    k.push_back(set.can_end ? '\1' : '\0');
    return k;
}

uint32_t GrammarMatcher::token_cost(int32_t id) {
    if (id < 0 || id >= trie_->n_vocab()) return kRejected;
    if (!looked_up_) {
        const auto it = cache_.find(key(current_));
        current_costs_ = it == cache_.end() ? nullptr : &it->second;
        looked_up_ = true;
    }
    if (current_costs_ != nullptr) return (*current_costs_)[id];
    if (trie_->is_eog(id)) return current_.can_end ? 0 : kRejected;
    const std::string_view piece = trie_->piece(id);
    if (piece.empty()) return control_token_cost(id);
    const StateSet *after = advance_bytes(current_, piece);
    return after == nullptr ? kRejected : cost(*after);
}

// A token that writes no bytes: allowed only where a token edge names it.
uint32_t GrammarMatcher::control_token_cost(int32_t id) {
    advance_token(current_, id, scratch_a_);
    return scratch_a_.active.empty() && !scratch_a_.can_end ? kRejected : cost(scratch_a_);
}

const std::vector<uint32_t> &GrammarMatcher::token_costs() {
    if (!looked_up_) token_cost(0); // looks up the cache
    if (current_costs_ != nullptr) return *current_costs_;
    if (cache_.size() >= kCacheEntries) cache_.clear();
    std::vector<uint32_t> &costs = cache_[key(current_)];
    costs.assign(trie_->n_vocab(), kRejected);
    for (const int32_t id : trie_->eog_ids()) costs[id] = current_.can_end ? 0 : kRejected;

    // Depth-first over the preorder array: levels_[d] is the set after the first
    // d bytes of the current path, so a node reads its parent's set at d - 1.
    levels_[0] = current_;
    const std::vector<TokenTrie::Node> &nodes = trie_->nodes();
    for (size_t i = 0; i < nodes.size();) {
        const TokenTrie::Node &n = nodes[i];
        StateSet &here = levels_[n.depth];
        advance(levels_[n.depth - 1], n.byte, here);
        if (here.active.empty() && !here.can_end) {
            i = n.end; // no token below this prefix can be allowed
            continue;
        }
        if (n.tok_end > n.tok_begin) {
            const uint32_t c = cost(here);
            for (const int32_t *id = trie_->ids(n), *end = id + (n.tok_end - n.tok_begin); id != end; ++id) costs[*id] = c;
        }
        i = here.active.empty() ? n.end : i + 1;
    }
    for (const int32_t id : g_->token_ids())
        if (id < trie_->n_vocab() && trie_->piece(id).empty() && !trie_->is_eog(id)) costs[id] = control_token_cost(id);
    current_costs_ = &costs;
    return costs;
}

void GrammarMatcher::token_costs_reference(std::vector<uint32_t> &out) {
    out.assign(trie_->n_vocab(), kRejected);
    for (int32_t id = 0; id < trie_->n_vocab(); ++id) {
        if (trie_->is_eog(id)) {
            out[id] = current_.can_end ? 0 : kRejected;
        } else if (!trie_->piece(id).empty()) {
            const StateSet *after = advance_bytes(current_, trie_->piece(id));
            if (after != nullptr) out[id] = cost(*after);
        } else {
            out[id] = control_token_cost(id);
        }
    }
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
    const StateSet *after = advance_bytes(current_, bytes);
    if (after == nullptr) return false;
    current_ = *after;
    looked_up_ = false;
    current_costs_ = nullptr;
    return true;
}

void GrammarMatcher::accept(int32_t id) {
    looked_up_ = false;
    current_costs_ = nullptr;
    if (remaining_ > 0) --remaining_;
    if (trie_->is_eog(id)) {
        current_.active.clear();
        current_.can_end = true;
        return;
    }
    if (trie_->piece(id).empty()) {
        advance_token(current_, id, scratch_a_);
        if (scratch_a_.active.empty() && !scratch_a_.can_end) {
            fail("the sampler picked a token the grammar rejects");
            current_.active.clear();
            return;
        }
        current_ = scratch_a_;
        return;
    }
    const StateSet *after = advance_bytes(current_, trie_->piece(id));
    if (after == nullptr) {
        fail("the sampler picked a token the grammar rejects");
        current_.active.clear();
        return;
    }
    current_ = *after;
}

} // namespace llmd
