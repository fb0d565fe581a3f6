// grammar.h — constrained decoding: an automaton the sampler obeys token by token.
//
// Theory of operation. llmd/grammar.py compiles json_object, a JSON Schema or the
// tool-call wrapper into a recursive automaton and sends it as text. Every state
// has deterministic byte transitions, "call" edges (enter the callee state; once
// the callee accepts, continue at the return state) and an accept flag. Run with
// a stack of return states this is a pushdown automaton: recursion (nested JSON
// values, $ref) costs a stack frame, while everything regular inside one rule
// (strings, numbers, literals) is a plain transition, so one byte of a string is
// one range lookup.
//
// A matcher state is the set of configurations (state, stack) reachable after the
// bytes so far, closed under calls and returns; only configurations that can read
// a byte are kept, plus a flag saying the grammar may end here. Stacks are nodes
// (return state, parent) interned in an arena, so equal stacks are equal ids and
// a state set is a canonical key.
//
// Masking a vocabulary: TokenTrie holds the bytes of every text token as one
// preorder array. Walking it depth first advances the parent's state set by one
// byte per node and skips a whole subtree as soon as nothing survives, so shared
// prefixes are matched once. The walk's result (for each token, the bytes still
// needed to finish after it, or kRejected) is cached per state set: inside a
// string the set repeats at every character. token_cost() checks one token alone,
// which is all greedy decoding needs while the model's favourite is allowed.
//
// Control tokens ([TOOL_CALLS], <|tool_call|>) write no bytes, so a byte grammar
// could never produce them: a state may also have token edges, each taken by one
// specific control token id. They count as one byte (one token) towards finishing,
// and masking checks them after the trie walk, which only holds text tokens.
//
// Token budget: the shortest way to finish from any state is known in bytes, and
// every byte is a token of its own in a byte-level vocabulary, so a token is kept
// only if what must follow it still fits the tokens left. Once some token fits,
// one always will (the first byte of the shortest way), so output completes
// within max_tokens, closing strings and brackets early if it must. Bytes
// overcount tokens, so at first no token may fit: until one does, the budget
// does not constrain (the sampler checks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llmd {

class Vocab;

class Grammar {
public:
    static constexpr uint32_t kNone = UINT32_MAX;
    static constexpr uint32_t kInfinite = UINT32_MAX; // min_bytes() of a state that cannot finish
    static constexpr uint32_t kMaxStates = 1u << 20;
    static constexpr uint32_t kMaxEdges = 1u << 24;

    // Parses and checks the text form written by llmd/grammar.py:
    //   llmd-grammar 1 <n_states> <start>
    //   one line per state, each ending with a newline, items separated by one space:
    //     $          the state accepts (its rule may end here)
    //     LO-HI>T    bytes LO..HI (hex) go to state T; "LO>T" for one byte
    //     @C>R       call: enter state C, continue at state R when it accepts
    //     tID>T      control token ID (decimal) goes to state T
    // Refuses overlapping byte ranges or repeated token ids in a state, indices out of range, sizes over
    // the limits, a start state that cannot finish and left recursion (a call
    // cycle that reads no byte, which would grow the stack forever). Never throws
    // except std::bad_alloc.
    static std::unique_ptr<const Grammar> parse(std::string_view text, std::string *error);

    uint32_t start() const { return start_; }
    uint32_t size() const { return static_cast<uint32_t>(states_.size()); }
    bool accepts(uint32_t s) const { return states_[s].accept; }
    // The state reads a byte or a control token.
    bool reads_input(uint32_t s) const {
        return states_[s].range_begin != states_[s].range_end || states_[s].token_begin != states_[s].token_end;
    }
    // The state after reading b in s, or kNone.
    uint32_t next(uint32_t s, uint8_t b) const;
    // The state after control token id in s, or kNone.
    uint32_t next_token(uint32_t s, int32_t id) const;
    // Every control token id a token edge names, each once.
    const std::vector<int32_t> &token_ids() const { return token_ids_; }
    // The fewest bytes that take s to acceptance (callees included).
    uint32_t min_bytes(uint32_t s) const { return min_bytes_[s]; }

    struct Call {
        uint32_t callee, ret;
    };
    const Call *calls_begin(uint32_t s) const { return calls_.data() + states_[s].call_begin; }
    const Call *calls_end(uint32_t s) const { return calls_.data() + states_[s].call_end; }

private:
    struct Range {
        uint8_t lo, hi;
        uint32_t target;
    };
    struct TokenEdge {
        int32_t id;
        uint32_t target;
    };
    struct State {
        uint32_t range_begin = 0, range_end = 0, call_begin = 0, call_end = 0, token_begin = 0, token_end = 0;
        bool accept = false;
    };

    bool compute_min_bytes(std::string *error);
    void drop_dead_edges();
    bool check_left_recursion(std::string *error) const;

    std::vector<State> states_;
    std::vector<Range> ranges_;
    std::vector<Call> calls_;
    std::vector<TokenEdge> tokens_;
    std::vector<int32_t> token_ids_;
    std::vector<uint32_t> min_bytes_;
    uint32_t start_ = 0;
};

// The bytes of every token, for walking a grammar over the whole vocabulary.
// Built once per engine; read-only afterwards.
class TokenTrie {
public:
    TokenTrie(const Vocab &vocab, const std::vector<int32_t> &eog_ids);

    struct Node {
        uint8_t byte;
        uint16_t depth;     // 1 for a token's first byte
        uint32_t end;       // one past the last node of this node's subtree
        uint32_t tok_begin; // tokens whose bytes end here: ids_[tok_begin, tok_end)
        uint32_t tok_end;
    };
    const std::vector<Node> &nodes() const { return nodes_; }
    const int32_t *ids(const Node &n) const { return ids_.data() + n.tok_begin; }
    int n_vocab() const { return static_cast<int>(pieces_.size()); }
    int max_depth() const { return max_depth_; }
    // The bytes a token writes; empty for control tokens, which only a grammar's token
    // edges allow.
    std::string_view piece(int32_t id) const { return pieces_[id]; }
    bool is_eog(int32_t id) const { return eog_[id] != 0; }
    const std::vector<int32_t> &eog_ids() const { return eog_ids_; }

private:
    std::vector<Node> nodes_;
    std::vector<int32_t> ids_;
    std::vector<std::string_view> pieces_; // views into the Vocab, which outlives the trie
    std::vector<uint8_t> eog_;
    std::vector<int32_t> eog_ids_;
    int max_depth_ = 0;
};

class GrammarMatcher {
public:
    static constexpr uint32_t kRejected = UINT32_MAX;
    static constexpr uint32_t kMaxDepth = 1024;    // stack frames: deeper calls are not taken
    static constexpr size_t kMaxConfigs = 1024;     // per state set
    static constexpr size_t kMaxNodes = 1u << 22;   // interned stack frames
    static constexpr size_t kCacheEntries = 16;     // cached walks (n_vocab costs each)

    // token_budget > 0: tokens should leave room to finish within that many tokens.
    // 0: no budget. Without a trie only the byte-level methods (accept_bytes,
    // can_end, complete) work.
    GrammarMatcher(std::unique_ptr<const Grammar> grammar, const TokenTrie *trie, int32_t token_budget);

    // Bytes the grammar still needs after token id (0 for an end-of-generation id
    // where the grammar may end), or kRejected if id cannot come next.
    uint32_t token_cost(int32_t id);
    // token_cost() of every id from one walk of the trie; cached per state set.
    const std::vector<uint32_t> &token_costs();
    // The scalar reference for token_costs(): each token checked on its own.
    void token_costs_reference(std::vector<uint32_t> &out);

    // Whether a token of this cost leaves room to finish in the tokens left.
    bool within_budget(uint32_t cost) const { return !budgeted_ || static_cast<uint64_t>(cost) < remaining_; }
    // Advance past token id, which must not be kRejected.
    void accept(int32_t id);
    // Advance past raw bytes; false (and no change) if the grammar rejects them.
    bool accept_bytes(std::string_view bytes);
    // The grammar may end here.
    bool can_end() const { return current_.can_end; }
    // Nothing may follow: the sampler must stop.
    bool complete() const { return current_.active.empty(); }
    // Why the matcher gave up (a limit was hit), or "".
    const std::string &error() const { return error_; }

private:
    struct Config {
        uint32_t state, stack; // stack: node id or Grammar::kNone for the root frame
        bool operator==(const Config &o) const { return state == o.state && stack == o.stack; }
    };
    struct StateSet {
        std::vector<Config> active; // configurations that can read a byte
        bool can_end = false;
    };
    struct Node {
        uint32_t ret, parent, depth, min_rest; // min_rest: bytes to finish this frame and all below
    };

    void closure(Config seed, StateSet &out);
    // The configurations of `in` that next(state) moves (to a state, or kNone), closed.
    template <class Next> void step(const StateSet &in, Next next, StateSet &out);
    void advance(const StateSet &in, uint8_t byte, StateSet &out);
    void advance_token(const StateSet &in, int32_t id, StateSet &out);
    uint32_t control_token_cost(int32_t id);
    const StateSet *advance_bytes(const StateSet &in, std::string_view bytes);
    uint32_t cost(const StateSet &set) const;
    uint32_t frame_rest(uint32_t stack) const { return stack == Grammar::kNone ? 0 : nodes_[stack].min_rest; }
    uint32_t intern(uint32_t ret, uint32_t parent);
    std::string key(const StateSet &set) const;
    void fail(const char *why);

    std::unique_ptr<const Grammar> g_;
    const TokenTrie *trie_;
    bool budgeted_ = false;
    uint64_t remaining_ = 0; // tokens left, this step's included
    StateSet current_;
    std::vector<Node> nodes_;
    std::unordered_map<uint64_t, uint32_t> node_ids_; // (ret << 32 | parent) -> node id
    std::unordered_map<std::string, std::vector<uint32_t>> cache_; // state set key -> token costs
    const std::vector<uint32_t> *current_costs_ = nullptr;          // cache_ entry of current_, if any
    bool looked_up_ = false;                                        // current_costs_ is up to date
    std::vector<StateSet> levels_;                        // trie walk: state set per depth
    StateSet scratch_a_, scratch_b_;
    std::vector<Config> work_, seen_;
    std::string error_;
};

} // namespace llmd
