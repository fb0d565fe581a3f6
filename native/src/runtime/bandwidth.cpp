// bandwidth.cpp — see bandwidth.h.
#include "runtime/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace llmd {

uint64_t decode_bytes(const Model &m) {
    uint64_t bytes = m.weight_bytes; // every tensor, packed forms in place of originals
    const auto size = [](const Matrix &w) {
        const size_t packed = w.packed != nullptr ? packed_bytes(w.type, w.rows, w.cols) : 0;
        return static_cast<uint64_t>(packed != 0 ? packed : static_cast<size_t>(w.rows) * w.row_bytes);
    };
    if (m.tok_embd.data != m.output.data) bytes -= size(m.tok_embd) - m.tok_embd.row_bytes;
    if (m.ple_embd.data != nullptr) bytes -= size(m.ple_embd) - m.ple_embd.row_bytes; // a row per token too
    for (const LayerWeights &L : m.layers)
        for (const std::vector<Matrix> *stack : {&L.gate_exps, &L.up_exps, &L.down_exps})
            for (size_t e = 0; e < stack->size(); ++e) {
                const uint64_t all = size((*stack)[e]);
                bytes -= all - all * static_cast<uint64_t>(m.hp.n_expert_used) / static_cast<uint64_t>(m.hp.n_expert);
            }
    return bytes;
}

double read_bandwidth(ThreadPool &pool, size_t bytes, int passes) {
    constexpr size_t kPiece = size_t{4} << 20;
    const size_t pieces = std::max<size_t>(1, (bytes + kPiece - 1) / kPiece), words = kPiece / 8;
    std::vector<uint64_t> buffer(pieces * words, 1); // written once: the pages are mapped
    std::vector<uint64_t> sums(pieces);              // used, so that the reads are not optimized away
    std::vector<double> seconds;
    for (int pass = 0; pass <= passes; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        pool.run(static_cast<int>(pieces), [&](int piece) {
            const uint64_t *p = buffer.data() + static_cast<size_t>(piece) * words;
            uint64_t acc[8] = {};
            for (size_t i = 0; i < words; i += 8)
                for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
            sums[static_cast<size_t>(piece)] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
        });
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        if (pass > 0) seconds.push_back(took.count());
    }
    static volatile uint64_t sink;
    for (const uint64_t s : sums) sink = sink + s;
    std::nth_element(seconds.begin(), seconds.begin() + static_cast<ptrdiff_t>(seconds.size() / 2), seconds.end());
    return static_cast<double>(pieces * kPiece) / seconds[seconds.size() / 2];
}

} // namespace llmd
