// sampler.h — turns next-token logits into a token id with a request's sampling
// parameters: logit bias and penalties on the raw logits, then the grammar's mask
// if there is one, then greedy or temperature → top-k → top-p → min-p → (infill) →
// draw from a seeded RNG.
//
// The infill step (llmd_sampling.infill; llama.cpp's "infill" sampler, which
// code-completion clients ask for) makes a fill-in-the-middle reply end where an end is
// plausible and continue only with a confident token. Over the candidates' probabilities:
//   - if 3 × p(end-of-generation ids) × (number of candidates) > p(the rest), only
//     the end-of-generation candidates stay;
//   - else a candidate whose piece (the bytes it shows) is a prefix of another's is
//     merged with it: the less likely one's probability moves into the more likely one,
//     which stays. Only the kInfillMerge most likely candidates take part, as pairs
//     cost the square of their count; the others, each below 1 / kInfillMerge, neither
//     give nor take probability, and the next rule drops them unless they end generation;
//   - a text candidate (not end-of-generation) below kInfillKeep is dropped; then,
//     with n text candidates left, one below 1 / (n + 1) of what is left is dropped.
//     If no text candidate was left, the reply ends: the one candidate is the
//     vocabulary's end-of-turn token, else its EOS, unless logit bias or the grammar
//     bans it (then the candidates stand as the merge left them).
// Greedy requests (temperature <= 0) take the step too: the candidates are weighed at
// temperature 1, and the most likely survivor (the lowest id on a tie) is picked
// without drawing from the RNG.
#pragma once

#include "llmd.h"

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmd {

class GrammarMatcher;
class Vocab;

// The infill step merges among at most this many candidates, the most likely.
constexpr size_t kInfillMerge = 256;
// It drops a text candidate less likely than this after the merge.
constexpr float kInfillKeep = 0.2f;

class Sampler {
public:
    // Copies and checks the parameters, reseeds the RNG and forgets generated ids.
    // Returns false with *error on an out-of-range parameter. The vocabulary (its
    // pieces and end-of-generation ids, for the infill step) must outlive the sampler.
    bool configure(const llmd_sampling &s, const Vocab &vocab, std::string *error);

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
    void weigh(const float *logits, int n_vocab);
    void infill(const float *logits);
    int32_t draw();
    int32_t pick_constrained(float *logits, int n_vocab, GrammarMatcher &grammar, bool *forced);

    llmd_sampling params_{};
    const Vocab *vocab_ = nullptr;
    std::vector<std::pair<int32_t, float>> bias_;
    std::unordered_map<int32_t, int> generated_; // id -> count since configure()
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_; // (weight, id) left to pick from
};

} // namespace llmd
