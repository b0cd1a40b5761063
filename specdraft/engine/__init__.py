"""specdraft's speculative-decoding engine: one machine, batch 1 (one request at a time).

Following one token from `specdraft generate` (cli/decode.py) to the verification of one round:
`load` -> `speculate` -> `requests` -> `fast_draft` -> `tree` -> `fast_model` -> `sampling`
(compiled: `graphs`, `draft_round` and `rounds_ahead` too).
- `load`: `load_engine` (a target directory and a drafter or training checkpoint, paired and
  checked against the drafter's manifest; `pairing_notes`); `fast_config`: `ModelArgs`, the
  target configs the fast path runs; `fast_load`: `load_fast_target` (a transformers checkpoint
  into a FastTarget, strictly, through one table of the checkpoint layout).
- `errors`: `EngineError`, what the engine refuses of a target, drafter, request or setting.
- `speculate`: `SpeculativeEngine`, the loop: generate, prefill, step (draft, verify, accept,
  commit); `TargetRunner`, the target's forwards (eager, or CUDA graphs once compiled); the
  drafter's fit to the target (`check_pairing`).
- `requests`: `Request` (one generation's state: emit, stop strings, text, result) and
  `decode_continuation`.
- `fast_model`: the target on the hot path, a compact Llama / Qwen2 / Qwen3 / Mistral with a
  static KV cache written at explicit slots, parity-tested against transformers' logits.
- `fast_draft`: the drafter's weights packed for batch-1 steps (`FastDraft`), and those steps
  replayed as CUDA graphs (`GraphedDraft`).
- `draft_round`: a greedy draft round, tree selection included, as one CUDA graph (`GraphedRound`).
- `rounds_ahead`: greedy rounds (chains and trees) launched one round ahead of the host, the
  verdict, a tree's cache compaction and the next round's state taken on the device
  (`RoundsAhead`).
- `draft_cache`: the drafter's static K/V cache and rollback of rejected branches.
- `graphs`: the target's forwards as CUDA graphs (`GraphedTarget`, plain decoding ahead of the
  GPU: `decode_ahead`), their static inputs (`StaticInputs`), and `capture_graph`, through
  which every CUDA graph of the engine is captured.
- `tree`: draft tree expansion, selection and its attention masks.
- `sampling`: logits to probabilities; greedy, chain and tree acceptance rules.
- `spec_config`: `SpecConfig` (num_steps, topk, num_draft_tokens).
- `metrics`: per-request and summed `SpecMetrics` (acceptance, timings).
- `kernels/`: the Triton kernels (`linear_ops`, `norm_rope_ops`, `attention_ops`, launched through `pdl`) and the target forward built from them
  (`fused_decode`), taking weights and caches.

Other architectures (DeepSeek-V3 / MLA, MoE, multimodal) are captured and trained with
specdraft and served by SGLang or vLLM with the exported checkpoint.
"""
