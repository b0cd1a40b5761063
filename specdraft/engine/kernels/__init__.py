"""The engine's Triton kernels and the forwards built from them (CUDA, bf16 / fp16).

- `triton_ops`: the kernels (GEMV / thin GEMM with fused epilogues, add + RMSNorm, RoPE and
  K/V cache writes, split-KV attention over a static cache); import it only where Triton is
  installed.
- `fused_decode`: a target forward of at most `MAX_TOKENS` new tokens through those kernels,
  taking the layers' weights and caches (`LayerWeights`), plus `kernel_support`, which says
  whether a model's weights and attention shape can run there.
"""
