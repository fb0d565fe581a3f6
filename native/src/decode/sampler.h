// sampler.h — turns next-token logits into a token id with a request's sampling
// parameters: logit bias and penalties on the raw logits, then the grammar's mask
// if there is one, then greedy or temperature → top-k → top-p → min-p → draw from
// a seeded RNG.
#pragma once

#include "llmd.h"

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmd {

class GrammarMatcher;

class Sampler {
public:
    // Copies and checks the parameters, reseeds the RNG and forgets generated ids.
    // Returns false with *error on an out-of-range parameter.
    bool configure(const llmd_sampling &s, int n_vocab, std::string *error);

    // Picks a token from logits (modified in place). `history` is the session's
    // ids so far, for the repetition penalty. With a grammar, only a token it
    // allows is picked, and one within its token budget whenever there is one;
    // *forced then says whether the budget ruled out the token the grammar alone
    // would have given. Returns -1 if the grammar allows no token at all.
    int32_t sample(float *logits, int n_vocab, const std::vector<int32_t> &history, GrammarMatcher *grammar,
                   bool *forced);
    // The most likely id under the logit bias alone (the lowest on a tie), from logits
    // modified in place: what a draft of the request is picked as.
    int32_t pick_biased(float *logits, int n_vocab) const;

private:
    void adjust(float *logits, const std::vector<int32_t> &history);
    int32_t pick(const float *logits, int n_vocab);
    int32_t draw(const float *logits, int n_vocab);
    int32_t pick_constrained(float *logits, int n_vocab, GrammarMatcher &grammar, bool *forced);

    llmd_sampling params_{};
    std::vector<std::pair<int32_t, float>> bias_;
    std::unordered_map<int32_t, int> generated_; // id -> count since configure()
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_;
};

} // namespace llmd
