"""`conventions.dflash_reads`: a DFlash config.json as SGLang 0.5.22 and vLLM 0.32 read it (the
rules of `DFLASH_FACTS`), on hand-written configs of each shape the engines distinguish."""

from __future__ import annotations

from specdraft.conventions.dflash import DFLASH_FACTS, VLLM_CPU_DFLASH
from specdraft.conventions.dflash_reads import (
    TRAINED_ATTENTION,
    LayerAttention,
    engine_attention,
    engine_aux_layers,
    engine_num_speculative_tokens,
    served_block_size,
    trained_attention,
    vllm_reading,
)

BASE = {"num_hidden_layers": 2, "dflash_config": {"target_layer_ids": [1, 9, 17]}}


def test_both_engines_read_dflash_ids_plus_one():
    assert engine_aux_layers(BASE, "sglang") == (2, 10, 18)
    assert engine_aux_layers(BASE, "vllm") == (2, 10, 18)


def test_vllm_reads_a_top_level_list_first_and_an_eagle_config_over_dflash_ids():
    assert engine_aux_layers({**BASE, "eagle_aux_hidden_state_layer_ids": [3, 4, 5]}, "vllm") == (
        3,
        4,
        5,
    )
    assert engine_aux_layers({**BASE, "eagle_aux_hidden_state_layer_ids": [3, 4, 5]}, "sglang") == (
        2,
        10,
        18,
    )
    eagle = {**BASE, "eagle_config": {"use_aux_hidden_state": True}}  # no list: none read
    assert engine_aux_layers(eagle, "vllm") is None


def test_sglang_builds_default_ids_from_num_target_layers():
    config = {"num_hidden_layers": 5, "num_target_layers": 36, "dflash_config": {}}
    assert engine_aux_layers(config, "sglang") == (2, 10, 18, 26, 34)  # [1, 9, 17, 25, 33] + 1
    assert engine_aux_layers(config, "vllm") is None
    # the runtime target's layer count decides, not the config's (SGLang only warns)
    assert engine_aux_layers(config, "sglang", target_num_layers=28) == (2, 8, 14, 20, 26)


def test_layer_attention_per_engine():
    sliding = {
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 64,
    }
    want = [LayerAttention(64, True), TRAINED_ATTENTION]
    assert engine_attention(sliding, "sglang") == want == engine_attention(sliding, "vllm")
    qwen3 = {
        "num_hidden_layers": 2,
        "use_sliding_window": True,
        "sliding_window": 64,
        "max_window_layers": 1,
    }
    assert engine_attention(qwen3, "sglang") == [TRAINED_ATTENTION] * 2  # layer_types only
    assert trained_attention(qwen3) == [TRAINED_ATTENTION, LayerAttention(64, True)]
    swa = {"num_hidden_layers": 2, "sliding_window": 64, "dflash_config": {"use_swa": True}}
    assert engine_attention(swa, "vllm") == [LayerAttention(64, True)] * 2
    assert engine_attention(swa, "sglang") == [TRAINED_ATTENTION] * 2
    causal = {"num_hidden_layers": 2, "dflash_config": {"causal": True}}
    assert engine_attention(causal, "vllm") == [LayerAttention(None, True)] * 2


def test_vllm_translates_a_speculators_config_causal_unless_non_causal_is_set():
    config = {
        "speculators_model_type": "dflash",
        "transformer_layer_config": {"num_hidden_layers": 2},
        "aux_hidden_state_layer_ids": [2, 10],
        "mask_token_id": 7,
        "sliding_window_non_causal": False,  # speculators writes its default
    }
    read = vllm_reading(config)
    assert read["dflash_config"] == {"mask_token_id": 7, "target_layer_ids": [1, 9], "causal": True}
    assert engine_aux_layers(read, "vllm") == (2, 10)
    assert engine_attention(read, "vllm") == [LayerAttention(None, True)] * 2
    bidirectional = vllm_reading({**config, "sliding_window_non_causal": True})
    assert engine_attention(bidirectional, "vllm") == [TRAINED_ATTENTION] * 2
    config.pop("sliding_window_non_causal")  # absent: vLLM reads it as true
    assert engine_attention(vllm_reading(config), "vllm") == [TRAINED_ATTENTION] * 2


def test_the_setting_that_serves_a_block():
    assert engine_num_speculative_tokens("sglang", 16) == 16 == served_block_size("sglang", 16)
    assert engine_num_speculative_tokens("vllm", 16) == 15 and served_block_size("vllm", 15) == 16


def test_every_fact_names_its_source_and_the_cpu_answer_its_lines():
    assert all(f.source and f.value for f in DFLASH_FACTS)
    cpu = {f.engine: f.value for f in DFLASH_FACTS if f.fact == "serves on the CPU"}
    assert cpu["vllm"] == VLLM_CPU_DFLASH and "line 638" in VLLM_CPU_DFLASH
    assert cpu["sglang"].startswith("no:")
