// sampler.h — turns next-token logits into a token id with a request's sampling
// parameters: logit bias and penalties on the raw logits, then greedy or
// temperature → top-k → top-p → min-p → draw from a seeded RNG.
#pragma once

#include "llmd.h"

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmd {

class Sampler {
public:
    // Copies and checks the parameters, reseeds the RNG and forgets generated ids.
    // Returns false with *error on an out-of-range parameter.
    bool configure(const llmd_sampling &s, int n_vocab, std::string *error);

    // Picks a token from logits (modified in place). `history` is the session's
    // ids so far, for the repetition penalty.
    int32_t sample(float *logits, int n_vocab, const std::vector<int32_t> &history);

private:
    llmd_sampling params_{};
    std::vector<std::pair<int32_t, float>> bias_;
    std::unordered_map<int32_t, int> generated_; // id -> count since configure()
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_;
};

} // namespace llmd
