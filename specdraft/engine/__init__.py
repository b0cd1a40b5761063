"""specdraft's speculative-decoding engine: one machine; a request at a time (`speculate`), or a
continuously batched set of them (`batch`).

Following one token from `specdraft generate` (cli/decode.py) through one round:
`round` -> `eagle` (a tree: `eagle_tree` -> `tree` -> `sampling`) -> `fast_model` -> `requests`
(compiled: `graphs`, `draft_round` and `rounds_ahead` too); docs/ARCHITECTURE.md, "The round,
file by file".
- `load`: `load_engine` (a target directory and a drafter or training checkpoint, paired and
  checked against the drafter's manifest; `pairing_notes`); `fast_config`: `ModelArgs`, the
  target configs the fast path runs; `fast_load`: `load_fast_target` (a transformers checkpoint
  into a FastTarget, strictly, through one table of the checkpoint layout).
- `errors`: `EngineError`, what the engine refuses of a target, drafter, request or setting.
- `speculate`: `SpeculativeEngine` (set-up, generate, prefill, length limits; the proposer picked
  from the drafter) and the drafter's fit to the target (`check_pairing`).
- `round`: the round (`speculative_round`: propose, verify, accept, commit), the `Proposer` and
  `Target` protocols, `Proposal` (a chain's acceptance rule), `PlainDecoding`, and
  `TargetRunner` (the target's forwards: eager, or CUDA graphs once compiled).
- `eagle`: `FastDraft` (the drafter's weights packed for batch-1 steps), `DraftCache` (its static
  K/V cache, rolled back by length) and `EagleChain` (the chain proposer); `eagle_tree`:
  `EagleTree` (the tree proposer) and a tree's proposals and acceptance rule.
- `dflash_block`: `DFlashBlock`, the DFlash drafter's proposer (one block forward per round over
  its context's cached K/V), the settings it refuses (`block_problems`) and the target head it
  shares (`target_head`); `dflash_graph`: its rounds as CUDA graphs once compiled
  (`GraphedBlock`, one per bucket of new context positions: `block_buckets`).
- `requests`: `Request` (one generation's state: emit, stop strings, text, result),
  `SpecMetrics` (acceptance, timings) and `decode_continuation`.
- `fast_model`: the target on the hot path, a compact Llama / Qwen2 / Qwen3 / Mistral with a
  static KV cache written at explicit slots, parity-tested against transformers' logits.
- `draft_round`: the drafter's steps (`GraphedDraft`) and a greedy draft round, tree selection
  included (`GraphedRound`), as CUDA graphs.
- `rounds_ahead`: greedy rounds (chains and trees) launched one round ahead of the host, the
  verdict, a tree's cache compaction and the next round's state taken on the device
  (`RoundsAhead`).
- `graphs`: the target's forwards as CUDA graphs (`GraphedTarget`, plain decoding ahead of the
  GPU: `decode_ahead`), their static inputs (`StaticInputs`), and `capture_graph`, through
  which every CUDA graph of the engine is captured.
- `batch`: `BatchScheduler` (requests join and leave between batched rounds, K by batch size
  from `schedule.BatchSchedule`); `batch_target`: `BatchRunner`, B sequences verified in one
  target forward at their own cache rows and lengths; `batch_draft`: every row's EAGLE-3 chain
  or tree in one drafter forward per step; `hf_rows`: `RowCache`, the per-row K/V of
  a transformers-backed target in a batch (docs/ARCHITECTURE.md, "Batching").
- `tree`: draft tree expansion, selection and its attention masks.
- `sampling`: logits to probabilities; greedy, chain and tree acceptance rules.
- `spec_config`: `SpecConfig` (num_steps, topk, num_draft_tokens).
- `metrics`: the metrics table (`metrics_table`).
- `kernels/`: the Triton kernels (`linear_ops`, `norm_rope_ops`, `attention_ops`, launched through `pdl`) and the target forward built from them
  (`fused_decode`), taking weights and caches.

Other architectures (DeepSeek-V3 / MLA, MoE, multimodal) are captured and trained with
specdraft and served by SGLang or vLLM with the exported checkpoint.
"""
