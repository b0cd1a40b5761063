"""The engine's Triton kernels and the forwards built from them (CUDA, bf16 / fp16).

- `triton_ops`: the kernels (GEMV / thin GEMM with fused epilogues, add + RMSNorm, RoPE and
  K/V cache writes, split-KV attention over a static cache); import it only where Triton is
  installed.
- `expand_ops`: a greedy draft round's expansion (children's log-softmax and top-k, the next
  frontier, its draft-cache mask) in three launches a tree step; import it only where Triton is
  installed.
- `fused_decode`: a target forward of at most `MAX_TOKENS` new tokens through those kernels,
  taking the layers' weights and caches (`LayerWeights`), plus `kernel_support`, which says
  whether a model's weights and attention shape can run there.
"""
