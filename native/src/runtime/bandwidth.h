// bandwidth.h — the limit generation runs into: a decode step streams every weight
// it uses once, so tokens per second cannot beat (read bandwidth) / (bytes per token).
// `python -m llmd bench` reports generation as a share of that limit, both measured
// in the same run.
#pragma once

#include "model/model.h"
#include "runtime/threadpool.h"

#include <cstddef>
#include <cstdint>

namespace llmd {

// Bytes of weights one decode step reads: every matrix in the form the kernels read
// (packed where packed), but one row of an untied token embedding and of Gemma 4's
// per-layer embeddings, and, of each MoE layer's experts, the n_expert_used that a
// token is routed to.
uint64_t decode_bytes(const Model &model);

// Bytes per second the pool's threads read from a buffer of `bytes` (cut in 4 MiB
// pieces that the threads claim as they claim matmul rows), median of `passes`
// timed passes after one that maps the pages.
double read_bandwidth(ThreadPool &pool, size_t bytes, int passes);

} // namespace llmd
