// sampler.cpp — see sampler.h.
#include "decode/sampler.h"

#include "decode/grammar.h"
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string_view>

namespace llmd {

bool Sampler::configure(const llmd_sampling &s, const Vocab &vocab, std::string *error) {
    auto bad = [&](const char *what) {
        *error = std::string("invalid sampling parameter: ") + what;
        return false;
    };
    if (!std::isfinite(s.temperature) || s.temperature > 100.0f) return bad("temperature");
    if (!(s.top_p >= 0.0f) || !std::isfinite(s.top_p)) return bad("top_p");
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) return bad("min_p");
    if (!(s.repeat_penalty > 0.0f) || !std::isfinite(s.repeat_penalty)) return bad("repeat_penalty");
    if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty)) return bad("presence/frequency penalty");
    if (s.n_logit_bias < 0 || (s.n_logit_bias > 0 && (s.logit_bias_ids == nullptr || s.logit_bias_values == nullptr)))
        return bad("logit_bias");
    if (s.infill != 0 && s.infill != 1) return bad("infill");
    const int32_t n_vocab = vocab.size();
    std::vector<std::pair<int32_t, float>> bias;
    for (int32_t i = 0; i < s.n_logit_bias; ++i) {
        const int32_t id = s.logit_bias_ids[i];
        const float value = s.logit_bias_values[i];
        if (id < 0 || id >= n_vocab) return bad("logit_bias token id out of range");
        if (std::isnan(value) || value == INFINITY) return bad("logit_bias value");
        bias.emplace_back(id, value);
    }
    params_ = s;
    params_.logit_bias_ids = nullptr;
    params_.logit_bias_values = nullptr;
    vocab_ = &vocab;
    bias_ = std::move(bias);
    generated_.clear();
    rng_.seed(s.seed);
    return true;
}

namespace {

// The lowest id wins a tie.
int32_t argmax(const float *logits, int n_vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i)
        if (logits[i] > logits[best]) best = i;
    return best;
}

// Greedy decoding checks this many favourites one by one before masking everything.
constexpr int kLazyTries = 8;

// Candidates in the order to pick them: the heaviest first, the lowest id on a tie.
bool heavier(const std::pair<float, int32_t> &a, const std::pair<float, int32_t> &b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// a is a non-empty prefix of b: a token whose text may begin the other's.
bool is_prefix(std::string_view a, std::string_view b) { return !a.empty() && b.substr(0, a.size()) == a; }

} // namespace

int32_t Sampler::sample(float *logits, int n_vocab, const std::vector<int32_t> &history, GrammarMatcher *grammar,
                        bool *forced) {
    *forced = false;
    adjust(logits, history);
    const int32_t chosen = grammar ? pick_constrained(logits, n_vocab, *grammar, forced) : pick(logits, n_vocab);
    if (chosen >= 0) ++generated_[chosen];
    return chosen;
}

void Sampler::adjust(float *logits, const std::vector<int32_t> &history) {
    for (const auto &[id, value] : bias_) logits[id] += value;
    if (params_.repeat_penalty != 1.0f && params_.repeat_last_n != 0) {
        const size_t n = params_.repeat_last_n < 0 ? history.size()
                                                   : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
        std::vector<int32_t> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        for (const int32_t id : seen) {
            float &l = logits[id];
            // A tiny penalty may overflow the quotient: held at the largest float, the
            // ids it favours stay finite and share the draw (an infinity would make it NaN).
            l = l > 0.0f ? std::min(l / params_.repeat_penalty, FLT_MAX) : l * params_.repeat_penalty;
        }
    }
    for (const auto &[id, count] : generated_)
        logits[id] -= count * params_.frequency_penalty + params_.presence_penalty;
}

int32_t Sampler::pick_biased(float *logits, int n_vocab) const {
    for (const auto &[id, value] : bias_) logits[id] += value;
    return argmax(logits, n_vocab);
}

// Greedy decoding is the argmax, unless the infill step is to weigh the candidates first.
int32_t Sampler::pick(const float *logits, int n_vocab) {
    const bool greedy = params_.temperature <= 0.0f;
    if (greedy && !params_.infill) return argmax(logits, n_vocab);
    weigh(logits, n_vocab);
    if (params_.infill) infill(logits);
    if (!greedy) return draw();
    return std::min_element(candidates_.begin(), candidates_.end(), heavier)->second; // first in heavier's order
}

// Plain greedy decoding needs only the best allowed token, so it first checks the
// model's favourites one at a time (a few byte steps each). The full mask, one
// walk of the vocabulary trie (cached per grammar state), is the fallback, and
// the path for sampling and the infill step, which weigh every allowed token.
int32_t Sampler::pick_constrained(float *logits, int n_vocab, GrammarMatcher &grammar, bool *forced) {
    if (params_.temperature <= 0.0f && !params_.infill) {
        for (int tries = 0; tries < kLazyTries; ++tries) {
            const int32_t best = argmax(logits, n_vocab);
            if (logits[best] == -INFINITY) break;
            const uint32_t cost = grammar.token_cost(best);
            if (cost != GrammarMatcher::kRejected) {
                if (grammar.within_budget(cost)) return best;
                break; // over budget: whether any token fits takes the full mask
            }
            logits[best] = -INFINITY;
        }
    }
    const std::vector<uint32_t> &costs = grammar.token_costs();
    bool allowed = false, finite = false;
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (costs[i] == GrammarMatcher::kRejected) {
            logits[i] = -INFINITY;
        } else {
            allowed = true;
            finite = finite || logits[i] > -INFINITY;
        }
    }
    if (!allowed) return -1;
    if (!finite) // logit_bias banned every token the grammar allows: the grammar wins
        for (int32_t i = 0; i < n_vocab; ++i)
            if (costs[i] != GrammarMatcher::kRejected) logits[i] = 0.0f;
    int32_t id = pick(logits, n_vocab);
    if (!grammar.within_budget(costs[id])) {
        // Masking only on a miss leaves every step where the budget does not bind
        // as it was; for plain temperature sampling the result is exactly the
        // grammar's distribution conditioned on fitting the budget. While no
        // token fits (the budget is counted in bytes, so early on it may not),
        // the budget is no constraint yet.
        bool fits = false;
        for (int32_t i = 0; i < n_vocab && !fits; ++i) fits = logits[i] > -INFINITY && grammar.within_budget(costs[i]);
        if (fits) {
            *forced = true;
            for (int32_t i = 0; i < n_vocab; ++i)
                if (!grammar.within_budget(costs[i])) logits[i] = -INFINITY;
            id = pick(logits, n_vocab);
        }
    }
    return id;
}

// Leaves in candidates_ the ids that temperature, top-k, top-p and min-p keep, each with
// its weight (the best weighs 1). Greedy requests get here only for the infill step,
// which weighs the model's own probabilities: temperature 1.
void Sampler::weigh(const float *logits, int n_vocab) {
    // Each candidate is (weight, id); weights start as tempered logits less the best one's,
    // (logit - best) / temperature: the best is 0 however small the temperature, where
    // logit / temperature overflowed to infinity below about 1e-37 and made every weight NaN.
    const float temperature = params_.temperature > 0.0f ? params_.temperature : 1.0f;
    const float best = *std::max_element(logits, logits + n_vocab);
    candidates_.clear();
    for (int32_t i = 0; i < n_vocab; ++i)
        if (logits[i] > -INFINITY) candidates_.emplace_back((logits[i] - best) / temperature, i);
    if (candidates_.empty()) candidates_.emplace_back(0.0f, 0); // everything banned: fall back to id 0
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < candidates_.size()) {
        std::nth_element(candidates_.begin(), candidates_.begin() + params_.top_k - 1, candidates_.end(), heavier);
        candidates_.resize(params_.top_k);
    }
    double total = 0.0;
    for (auto &c : candidates_) total += (c.first = std::exp(c.first)); // the best weighs 1
    if (params_.top_p < 1.0f) {
        // Sort only as far as the nucleus reaches: most mass sits in a few hundred ids.
        size_t sorted = std::min<size_t>(candidates_.size(), 256), n = 0;
        std::partial_sort(candidates_.begin(), candidates_.begin() + sorted, candidates_.end(), heavier);
        for (double cum = 0.0; n < candidates_.size() && cum < params_.top_p * total; ++n) {
            if (n == sorted) {
                sorted = candidates_.size();
                std::sort(candidates_.begin() + n, candidates_.end(), heavier);
            }
            cum += candidates_[n].first;
        }
        candidates_.resize(std::max<size_t>(n, 1));
    }
    if (params_.min_p > 0.0f) {
        candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                         [&](const auto &c) { return c.first < params_.min_p; }),
                          candidates_.end());
    }
}

// The fill-in-the-middle step over candidates_, as sampler.h tells it. logits are the
// adjusted ones, where -infinity marks a token banned by logit bias or the grammar.
void Sampler::infill(const float *logits) {
    const std::vector<int32_t> &eog = vocab_->eog_ids();
    auto ends = [&](int32_t id) { return std::find(eog.begin(), eog.end(), id) != eog.end(); };
    double eog_mass = 0.0, text_mass = 0.0;
    for (const auto &c : candidates_) (ends(c.second) ? eog_mass : text_mass) += c.first;
    // An end is likely enough: end, with whichever end-of-generation candidate.
    if (3.0 * eog_mass * static_cast<double>(candidates_.size()) > text_mass) {
        candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                         [&](const auto &c) { return !ends(c.second); }),
                          candidates_.end());
        return;
    }
    const double total = eog_mass + text_mass;
    for (auto &c : candidates_) c.first = static_cast<float>(c.first / total);

    // Merge prefixes into the likelier token among the most likely (kInfillMerge).
    const size_t n_merge = std::min(candidates_.size(), kInfillMerge);
    std::partial_sort(candidates_.begin(), candidates_.begin() + n_merge, candidates_.end(), heavier);
    std::vector<std::string_view> shown(n_merge); // what each token adds to the text
    for (size_t i = 0; i < n_merge; ++i) {
        const int32_t id = candidates_[i].second;
        shown[i] = vocab_->is_control(id) ? std::string_view() : vocab_->piece(id);
    }
    for (size_t i = 0; i < n_merge; ++i) {
        for (size_t j = 0; j < n_merge && candidates_[i].first > 0.0f; ++j) { // 0: merged into another
            if (j == i || candidates_[j].first == 0.0f || !is_prefix(shown[i], shown[j])) continue;
            size_t into = i, from = j;
            if (candidates_[j].first > candidates_[i].first) std::swap(into, from);
            candidates_[into].first += candidates_[from].first;
            candidates_[from].first = 0.0f;
        }
    }
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                     [](const auto &c) { return c.first == 0.0f; }),
                      candidates_.end());

    // Keep text only where it is confident; with none, end the turn.
    auto confident = [&](const auto &c) { return !ends(c.second) && c.first >= kInfillKeep; };
    const auto n_text = static_cast<size_t>(std::count_if(candidates_.begin(), candidates_.end(), confident));
    if (n_text == 0) {
        const int32_t end = vocab_->eot() >= 0 ? vocab_->eot() : vocab_->eos();
        if (end >= 0 && logits[end] > -INFINITY) candidates_.assign(1, {1.0f, end});
        return;
    }
    auto drop_text_below = [&](double floor) {
        candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                         [&](const auto &c) { return !ends(c.second) && c.first < floor; }),
                          candidates_.end());
    };
    drop_text_below(kInfillKeep);
    double left = 0.0;
    for (const auto &c : candidates_) left += c.first;
    drop_text_below(left / static_cast<double>(n_text + 1));
}

// Draws one of candidates_ with the chance of its weight.
int32_t Sampler::draw() {
    double mass = 0.0;
    for (const auto &c : candidates_) mass += c.first;
    const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * mass;
    double cum = 0.0;
    int32_t chosen = candidates_.back().second;
    for (const auto &c : candidates_) {
        cum += c.first;
        if (u < cum) { chosen = c.second; break; }
    }
    return chosen;
}

} // namespace llmd
