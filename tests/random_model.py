"""Random-weight GGUFs at real sizes, for benchmarks and reference checks.

    python -m tests.random_model OUT.gguf --shape llama-3.2-1b
    python -m tests.random_model OUT.gguf --shape k256 [--output-norm 0.5]
    python -m tests.random_model OUT.gguf --shape qwen3.5-0.8b --nextn 1
    python -m tests.random_model OUT.gguf --shape qwen3-1.7b --fim
    python -m tests.random_model OUT.gguf --shape qwen3-0.6b --reranker

F16 weights drawn from random bytes (a billion of them take seconds, not the hours
Python's Gaussian would), the writer's byte-level BPE vocabulary padded with
reserved control tokens to the shape's size. Quantize the file with llama.cpp's
llama-quantize to get Q4_K_M, Q4_0, Q8_0, ... files of the same weights.

Shapes:
  llama-3.2-1b  n_embd 2048, 16 layers, 32 / 8 heads, ff 8192, vocab 128256, tied
  k256          n_embd 512, 4 layers, 8 / 4 heads, ff 1536, vocab 1024: every row a
                whole number of 256-element K-quant super-blocks, so llama-quantize
                has no reason to fall back to 32-element types for any matrix
  qwen3-0.6b    qwen3: n_embd 1024, 28 layers, 16 / 8 heads of 128, ff 3072, vocab
                151936, tied, RoPE base 1e6 (Qwen3-0.6B's and Qwen3-Reranker-0.6B's config)
  qwen3-1.7b    qwen3: n_embd 2048, 28 layers, 16 / 8 heads of 128, ff 6144, vocab
                151936, tied, RoPE base 1e6 (Qwen3-1.7B's config)
  gemma-3-1b    gemma3: n_embd 1152, 26 layers, 4 / 1 heads of 256, ff 6912, vocab
                262144, tied; a 512-position window on five layers of six, local RoPE
                base 1e4, global 1e6 (Gemma-3-1B's config)
  gemma-2-2b    gemma2: n_embd 2304, 26 layers, 8 / 4 heads of 256, ff 9216, vocab
                256000, tied; a 4,096-position window on the even layers, RoPE base 1e4,
                attention and final logits soft-capped at 50 and 30 (Gemma-2-2B's config)
  qwen3moe-1b   qwen3moe: Qwen3-30B-A3B's layer (heads of 128, q wider than n_embd,
                experts of 768, 8 routed per token) at half its width and with half
                its experts: n_embd 1024, 6 layers, 16 / 2 heads, 64 experts, vocab
                151936, untied; 1.25 B weights, 0.3 B of them read per token
  qwen3.5-moe-2b  qwen35moe: Qwen3.5-35B-A3B's layers at half their width (n_embd 1024;
                attention 8 / 2 heads of 256, DeltaNet 8 key and 16 value heads of 128;
                experts of 256 and a shared one of 256) with all 256 of its experts, 8
                routed per token, in 8 of its 40 layers (twice its pattern of three
                DeltaNet layers and one attention layer); vocab 248320, untied; 2.2 B
                weights, 0.4 B of them read per token
"""
from __future__ import annotations

import argparse
import array
import math
import random

from tests.support.gguf_writer import (
    F32, GGML_F16, STRING, build_tiny_gemma2, build_tiny_gemma3, build_tiny_gemma4, build_tiny_llama,
    build_tiny_qwen35, build_tiny_qwen3moe, encode_f32, make_reranker, name_last_tokens,
)

# shape -> (builder, its arguments, metadata it sets afterwards)
SHAPES = {
    "llama-3.2-1b": (build_tiny_llama, dict(n_vocab=128256, n_embd=2048, n_layer=16, n_head=32, n_head_kv=8,
                                            n_ff=8192, n_ctx=4096, reserved=127000), {}),
    "k256": (build_tiny_llama, dict(n_vocab=1024, n_embd=512, n_layer=4, n_head=8, n_head_kv=4, n_ff=1536,
                                    n_ctx=2048, reserved=256), {}),
    "qwen3-0.6b": (build_tiny_llama, dict(arch="qwen3", n_vocab=151936, n_embd=1024, n_layer=28, n_head=16,
                                          n_head_kv=8, head_dim=128, n_ff=3072, n_ctx=4096, reserved=150000),
                   {"qwen3.rope.freq_base": 1e6, "qwen3.attention.layer_norm_rms_epsilon": 1e-6}),
    "qwen3-1.7b": (build_tiny_llama, dict(arch="qwen3", n_vocab=151936, n_embd=2048, n_layer=28, n_head=16,
                                          n_head_kv=8, head_dim=128, n_ff=6144, n_ctx=4096, reserved=150000),
                   {"qwen3.rope.freq_base": 1e6, "qwen3.attention.layer_norm_rms_epsilon": 1e-6}),
    "gemma-3-1b": (build_tiny_gemma3, dict(n_vocab=262144, n_embd=1152, n_layer=26, n_head=4, n_head_kv=1,
                                           head_dim=256, n_ff=6912, n_ctx=4096, window=512, pattern=6,
                                           rope_base_local=10000.0, tied=True, reserved=260000), {}),
    "gemma-2-2b": (build_tiny_gemma2, dict(n_vocab=256000, n_embd=2304, n_layer=26, n_head=8, n_head_kv=4,
                                           head_dim=256, n_ff=9216, n_ctx=8192, window=4096, attn_softcap=50.0,
                                           softcap=30.0, reserved=254000),
                   {"gemma2.rope.freq_base": 10000.0}),
    # Gemma 4 E2B: 35 layers, four local (heads of 256, window 512) then one global (heads
    # of 512, a quarter of their dims turned); the last 20 read the caches of layers 13
    # and 14 with FFNs twice as wide; per-layer inputs of 256; values of their own.
    "gemma-4-e2b": (build_tiny_gemma4, dict(n_vocab=262144, n_embd=1536, local=tuple(l % 5 != 4 for l in range(35)),
                                            n_head=8, kv_heads=(1, 1), head_dims=(256, 512), turned=64, n_ff=6144,
                                            shared=20, per_layer=256, values=True, softcap=30.0, n_ctx=8192,
                                            window=512, reserved=260000), {}),
    "qwen3moe-1b": (build_tiny_qwen3moe, dict(n_vocab=151936, n_embd=1024, n_layer=6, n_head=16, n_head_kv=2,
                                              head_dim=128, n_expert=64, n_expert_used=8, n_ff_exp=768,
                                              n_ctx=4096, reserved=150000),
                    {"qwen3moe.rope.freq_base": 1e6, "qwen3moe.attention.layer_norm_rms_epsilon": 1e-6}),
    # Qwen3.5-0.8B: 6 x (3 Gated DeltaNet layers, 1 gated attention layer), 16 key and 16
    # value heads of 128 in DeltaNet, 8/2 heads of 256 in attention, RoPE over 64 dims.
    "qwen3.5-0.8b": (build_tiny_qwen35, dict(n_vocab=248320, n_embd=1024, n_layer=24, interval=4, n_head=8,
                                             n_head_kv=2, head_dim=256, rope_dim=64, sections=(11, 11, 10, 0),
                                             n_ff=3584, k_heads=16, v_heads=16, state=128, conv_len=4,
                                             n_ctx=4096, reserved=246000),
                     {"qwen35.rope.freq_base": 1e7, "qwen35.attention.layer_norm_rms_epsilon": 1e-6}),
    "qwen3.5-moe-2b": (build_tiny_qwen35, dict(n_vocab=248320, n_embd=1024, n_layer=8, interval=4, n_head=8,
                                               n_head_kv=2, head_dim=256, rope_dim=64, sections=(11, 11, 10, 0),
                                               n_ff=256, k_heads=8, v_heads=16, state=128, conv_len=4,
                                               n_expert=256, n_expert_used=8, n_ff_exp=256, n_ff_shexp=256,
                                               n_ctx=4096, reserved=246000),
                       {"qwen35moe.rope.freq_base": 1e7, "qwen35moe.attention.layer_norm_rms_epsilon": 1e-6}),
}


def random_f16(cols: int, rows: int, std: float, rng: random.Random) -> bytes:
    """cols x rows halves with random signs and mantissas whose exponents put |w| in
    [std / 8, 2 std): each value's high byte (sign, 5 exponent bits, 2 mantissa bits)
    gets one of three exponents around log2(std) from its own random bits."""
    top = 15 + math.floor(math.log2(std))
    exponents = [top - 2, top - 1, top, top]
    table = bytes((b & 0x83) | exponents[(b >> 2) & 3] << 2 for b in range(256))
    n, chunk = 2 * cols * rows, 1 << 26  # randbytes takes at most 2^31 bits at a time
    data = bytearray(b"".join(rng.randbytes(min(chunk, n - i)) for i in range(0, n, chunk)))
    data[1::2] = bytes(data[1::2]).translate(table)
    return bytes(data)


def scale_output_norm(w, factor: float) -> None:
    """Multiplies the F32 output norm's weights by factor, and with them every logit: a
    temperature of 1 / factor built into the file."""
    norm = w.tensor("output_norm.weight")
    norm.data = encode_f32([v * factor for v in array.array("f", norm.data)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output-norm", type=float, default=1.0,
                        help="scale the output norm's weights, and so every logit (default 1): random weights put a "
                             "text's tokens ~24 nats below the top logit; k256 at 0.5 gives next-token "
                             "distributions of about 3 nats' entropy, the text's tokens within 16 nats of the "
                             "top at 95 %% of positions")
    parser.add_argument("--fim", action="store_true",
                        help="name the last reserved tokens as Qwen2.5-Coder's fill-in-the-middle markers, "
                             "for /infill")
    parser.add_argument("--reranker", action="store_true",
                        help="make it a reranker as Qwen3-Reranker is (the qwen3 shapes): rank pooling, a yes/no "
                             "classifier head and the rerank prompt, for /v1/rerank")
    parser.add_argument("--nextn", type=int, default=0,
                        help="multi-token-prediction blocks after the layers (the Qwen3.5 shapes; the published "
                             "Qwen3.5 models have one), for --speculative mtp")
    args = parser.parse_args()
    builder, shape, floats = SHAPES[args.shape]
    if args.nextn and builder is not build_tiny_qwen35:
        parser.error("--nextn: only the Qwen3.5 shapes have multi-token-prediction blocks")
    if args.reranker and shape.get("arch") != "qwen3":
        parser.error("--reranker: only the qwen3 shapes are rerankers")
    nextn = {"nextn": args.nextn} if args.nextn else {}
    w = builder(**shape, **nextn, weight_type=GGML_F16, seed=args.seed, random_matrix=random_f16)
    scale_output_norm(w, args.output_norm)
    if args.fim:
        name_last_tokens(w)
    if args.reranker:
        make_reranker(w, shape["n_embd"], random.Random(args.seed))
    w.set("general.name", STRING, f"random-{args.shape}")
    for key, value in floats.items():
        w.set(key, F32, value)
    w.write(args.out)


if __name__ == "__main__":
    main()
