"""specdraft's speculative-decoding engine (single machine, batch 1 and small batches).

- `fast_model`: the target on the hot path, a compact Llama / Qwen2 / Qwen3 / Mistral with a
  static KV cache written at explicit slots, parity-tested against transformers' logits.
- `cache`: static KV caches of the drafter and rollback of rejected branches.
- `sampling`: logits to probabilities; chain and tree rejection sampling.
- `tree`: draft tree expansion and its attention masks.
- `speculate`: prefill, draft, verify, accept: the loop, plus per-request metrics.

Other architectures (DeepSeek-V3 / MLA, MoE, multimodal) are captured and trained with
specdraft and served by SGLang or vLLM with the exported checkpoint.
"""
