"""The engine's Triton kernels and the forwards built from them (CUDA, bf16 / fp16).

- the kernels, by family (import them only where Triton is installed): `linear_ops` (GEMV /
  thin GEMM with fused epilogues: silu * up, RoPE + K/V cache writes), `norm_rope_ops` (add +
  RMSNorm; per-head norm, RoPE and K/V cache writes), `attention_ops` (split-KV attention over
  a static cache); `pdl`: their launch with programmatic dependent launch on Hopper.
- `expand_ops`: a greedy draft round's expansion (children's log-softmax and top-k, the next
  frontier, its draft-cache mask) in three launches a tree step; import it only where Triton is
  installed.
- `fused_decode`: a target forward of at most `MAX_TOKENS` new tokens through those kernels,
  taking the layers' weights and caches (`LayerWeights`), plus `kernel_support`, which says
  whether a model's weights and attention shape can run there.
- `fused_draft`: an EAGLE-3 drafter step through those kernels (`eagle.FastDraft.triton_step`);
  import it only where Triton is installed.
"""
