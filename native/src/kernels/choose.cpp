// choose.cpp — which kernel variants this build has, which of them this CPU runs (as
// the CPU reports it: CPUID and XGETBV on x86-64; on arm64 the kernel's hardware
// capabilities on Linux, sysctl on macOS), and the one the engine uses.
#include "kernels/kernels.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace llmd {

namespace {

bool always() { return true; }

#if defined(__x86_64__)

struct X86Features {
    bool avx2 = false;     // AVX2 + FMA + F16C, with the OS saving YMM state
    bool avx_vnni = false; // and the VEX-coded VNNI (AVX-VNNI)
    bool avx512 = false;   // AVX-512 F, BW, VL and VNNI, with the OS saving ZMM state
    bool intel = false;    // the vendor is "GenuineIntel" (prefetch_to_l2)
};

X86Features read_x86_features() {
    X86Features f;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
    f.intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e; // "Genu", "ineI", "ntel"
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
    const bool fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1, f16c = c >> 29 & 1;
    if (!osxsave || !avx) return f;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const bool ymm_state = (xcr0_lo & 0x06) == 0x06, zmm_state = (xcr0_lo & 0xe6) == 0xe6;
    if (!ymm_state || __get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return f;
    const unsigned leaf7_subleaves = a;
    const bool avx2 = b >> 5 & 1, avx512f = b >> 16 & 1, avx512bw = b >> 30 & 1, avx512vl = b >> 31 & 1;
    const bool avx512vnni = c >> 11 & 1;
    bool avx_vnni = false;
    if (leaf7_subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) avx_vnni = a >> 4 & 1;
    f.avx2 = avx2 && fma && f16c;
    f.avx_vnni = f.avx2 && avx_vnni;
    f.avx512 = f.avx2 && zmm_state && avx512f && avx512bw && avx512vl && avx512vnni;
    return f;
}

const X86Features &x86_features() {
    static const X86Features f = read_x86_features();
    return f;
}

bool has_avx2() { return x86_features().avx2; }
bool has_avx_vnni() { return x86_features().avx_vnni; }
bool has_avx512() { return x86_features().avx512; }

#elif defined(__aarch64__)

// FEAT_DotProd (SDOT/UDOT) and FEAT_I8MM (USDOT, SMMLA), as the OS reports them.
struct ArmFeatures {
    bool dotprod = false;
    bool i8mm = false;
};

#if defined(__APPLE__)
bool sysctl_flag(const char *name) {
    int value = 0;
    size_t size = sizeof value;
    return sysctlbyname(name, &value, &size, nullptr, 0) == 0 && value != 0;
}

ArmFeatures read_arm_features() {
    return {sysctl_flag("hw.optional.arm.FEAT_DotProd"), sysctl_flag("hw.optional.arm.FEAT_I8MM")};
}
#elif defined(__linux__)
ArmFeatures read_arm_features() {
    constexpr unsigned long kHwcapAsimdDp = 1ul << 20, kHwcap2I8mm = 1ul << 13; // Linux's asm/hwcap.h
    return {(getauxval(AT_HWCAP) & kHwcapAsimdDp) != 0, (getauxval(AT_HWCAP2) & kHwcap2I8mm) != 0};
}
#else
ArmFeatures read_arm_features() { return {}; }
#endif

const ArmFeatures &arm_features() {
    static const ArmFeatures f = read_arm_features();
    return f;
}

bool has_dotprod() { return arm_features().dotprod; }
bool has_i8mm() { return arm_features().dotprod && arm_features().i8mm; } // the variant uses both

#endif

// Slowest first: the fastest variant a CPU runs is the last it has.
const KernelVariant kVariants[] = {
    {"scalar", always, kernels_scalar},
#if defined(__x86_64__)
    {"avx2", has_avx2, kernels_avx2},
    {"avx-vnni", has_avx_vnni, kernels_avx_vnni},
    {"avx512", has_avx512, kernels_avx512},
#elif defined(__aarch64__)
    {"neon", always, kernels_neon},
    {"dotprod", has_dotprod, kernels_dotprod},
    {"i8mm", has_i8mm, kernels_i8mm},
#endif
};
constexpr int kVariantCount = sizeof kVariants / sizeof kVariants[0];

const Kernels &fastest() {
    for (int i = kVariantCount - 1; i > 0; --i)
        if (kVariants[i].cpu_runs()) return kVariants[i].table();
    return kernels_scalar();
}

} // namespace

#if defined(__x86_64__)
bool prefetch_to_l2() { return x86_features().intel; }
#endif

int kernel_variant_count() { return kVariantCount; }
const KernelVariant &kernel_variant(int i) { return kVariants[i]; }

const Kernels *kernels_named(const char *name, std::string &error) {
    std::string names, runs;
    for (const KernelVariant &v : kVariants) {
        if (std::strcmp(v.name, name) == 0) {
            if (v.cpu_runs()) return &v.table();
            error = std::string("this CPU lacks the instructions of kernel variant ") + name;
        }
        names += (names.empty() ? "" : ", ") + std::string(v.name);
        if (v.cpu_runs()) runs += (runs.empty() ? "" : ", ") + std::string(v.name);
    }
    if (error.empty()) error = std::string("no kernel variant ") + name + " in this build (it has: " + names + ")";
    error += "; this CPU runs: " + runs;
    return nullptr;
}

bool choose_kernels(std::string &error) {
    const char *want = std::getenv("LLMD_KERNELS");
    if (want == nullptr || *want == '\0') return true;
    if (kernels_named(want, error) != nullptr) return true;
    error = "LLMD_KERNELS=" + std::string(want) + ": " + error;
    return false;
}

const Kernels &kernels() {
    static const Kernels &chosen = [&]() -> const Kernels & {
        const char *want = std::getenv("LLMD_KERNELS");
        std::string error;
        const Kernels *named = want != nullptr && *want != '\0' ? kernels_named(want, error) : nullptr;
        return named != nullptr ? *named : fastest();
    }();
    return chosen;
}

} // namespace llmd
