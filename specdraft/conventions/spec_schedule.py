"""How vLLM and SGLang read a K-by-batch-size speculative schedule, each with the engine file and
version it was read from (what `specdraft tune --concurrency` writes, `bench.load_schedule`).

vLLM 0.32.0: `SpeculativeConfig.num_speculative_tokens_per_batch_size` (config/speculative.py:
`list[tuple[int, int, int]] | None`, in --speculative-config) is a list of inclusive ranges
[range_start, range_end, K]; v1/spec_decode/dynamic/utils.py
`validate_and_normalize_dynamic_sd_schedule` refuses a non-list, an empty list, an entry not of
3 items, a non-positive range bound, start > end, K < 0, overlapping ranges, and a first range
not starting at 1; `build_dynamic_sd_schedule_lookup` (called by v1/core/sched/scheduler.py with
scheduler_config.max_num_seqs, and num_speculative_tokens, which must be > 0) carries the previous
K through a gap and the last K through max_num_seqs, clips a range end past max_num_seqs, and caps
every K at num_speculative_tokens. config/vllm.py disables the schedule under data parallelism.

SGLang: --speculative-adaptive with --speculative-adaptive-config FILE
(srt/speculative/adaptive_spec_params.py, sgl-project/sglang commit 13d3f642): a JSON object
whose integer-string keys are batch sizes, each {"candidate_steps": [non-negative ints], ...}; a
batch routes to the largest key <= its (CUDA-graph padded) size, the smallest key below it, and
within a slot the steps move among candidate_steps by an EMA of acceptance (one candidate: fixed);
steps 0 = no drafting. Only EAGLE / EAGLE3 with topk 1 (`adaptive_unsupported_reason`: else it
falls back to static steps with a warning); --speculative-num-steps must be one of the candidates
(srt/arg_groups/speculative_hook.py `_init_adaptive_speculative_params`), and num_draft_tokens
becomes num_steps + 1.
"""

from __future__ import annotations

VLLM_SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
VLLM_SCHEDULE_SOURCE = (
    "vllm 0.32.0 config/speculative.py, v1/spec_decode/dynamic/utils.py "
    "validate_and_normalize_dynamic_sd_schedule / build_dynamic_sd_schedule_lookup"
)
# vLLM 0.32.0 engine/arg_utils.py get_batch_defaults: `vllm serve`'s max_num_seqs on a GPU of
# >= 70 GiB (H100, H200, B200); 256 on smaller GPUs, 128 per CPU socket.
VLLM_DEFAULT_MAX_NUM_SEQS = 1024
SGLANG_ADAPTIVE_SOURCE = (
    "sglang srt/speculative/adaptive_spec_params.py (sgl-project/sglang 13d3f642): "
    "--speculative-adaptive --speculative-adaptive-config"
)
SGLANG_ADAPTIVE_FLAGS = "--speculative-adaptive --speculative-adaptive-config"
