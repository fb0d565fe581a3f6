// arch/arch.h — what one architecture adds to the shared decoder (model.h).
//
// Each family lives in its own arch/<family>.cpp as three steps over the shared ops:
//   load_hparams — the family's metadata beyond the keys every decoder has;
//   bind         — the names and shapes of its tensors (Binder marks each one used;
//                  Model::load refuses a file holding any tensor left unbound);
//   layer        — one transformer block over a batch, reading top-down.
// The engine ABI and sessions see only the name; nothing else is per architecture.
#pragma once

#include "model/model.h"
#include "ops/recurrent.h"

#include <string>
#include <string_view>

namespace llmd {

struct Arch {
    const char *name; // general.architecture
    // Reads the family's own metadata into hp (the shared keys are read already).
    void (*load_hparams)(Binder &b, HParams &hp);
    // Binds every tensor of the family into m (hp is complete).
    void (*bind)(Binder &b, Model &m);
    // x (n, dim) of the pass's workspace through block l.
    void (*layer)(const Pass &p, const LayerWeights &L, int l);
};

extern const Arch kLlama, kCohere2, kErnie45, kErnie45Moe, kExaone4, kGemma, kGemma2, kGemma3, kGemma4, kGlm4,
    kGlm4Moe, kGptOss, kGranite, kGraniteMoe, kGraniteHybrid, kLfm2, kLfm2Moe, kMistral3, kNemotronH, kNemotronHMoe,
    kOlmo2, kPhi3, kQwen2, kQwen2Moe, kQwen3, kQwen35, kQwen35Moe, kQwen3Moe, kSmallThinker, kSmolLM3;

// The architecture named `name`, or nullptr.
const Arch *find_arch(std::string_view name);
// "llama, qwen2, ...": what find_arch knows, for refusals.
std::string arch_names();

} // namespace llmd
