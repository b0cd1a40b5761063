"""FC-03: aux-id convention off by one between SGLang and vLLM."""

import pytest

from specdraft.conventions import (
    ConventionError,
    aux_layers_from_config,
    from_engine_ids,
    lint_sglang_ids,
    to_engine_ids,
)

NUM_LAYERS = 32
TRAINED = [2, 16, 29]  # the manifest's specdraft (HF hidden_states) indices


def test_case_fc03_same_ids_mean_different_layers():
    vllm_ids = to_engine_ids(TRAINED, "vllm", NUM_LAYERS)
    sglang_ids = to_engine_ids(TRAINED, "sglang", NUM_LAYERS)
    assert (vllm_ids, sglang_ids) == ([2, 16, 29], [1, 15, 28])
    # vLLM-convention ids read by SGLang, and the reverse: each off by one layer
    assert from_engine_ids(vllm_ids, "sglang", NUM_LAYERS) == [3, 17, 30]
    assert from_engine_ids(sglang_ids, "vllm", NUM_LAYERS) == [1, 15, 28]


def test_case_fc03_nested_only_file_read_differently():
    config = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    reading = aux_layers_from_config(config, NUM_LAYERS)
    assert reading.captured("sglang") == TRAINED
    assert reading.captured("vllm") == [1, 15, 28]
    (problem,) = reading.problems()
    assert "read differently by the two engines" in problem and "top-level" in problem


def test_case_fc03_export_writes_each_engine_its_own_ids():
    config = {
        "eagle_aux_hidden_state_layer_ids": to_engine_ids(TRAINED, "vllm", NUM_LAYERS),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": to_engine_ids(TRAINED, "sglang", NUM_LAYERS)
        },
    }
    reading = aux_layers_from_config(config, NUM_LAYERS)
    assert reading.captured("sglang") == reading.captured("vllm") == TRAINED
    assert reading.problems() == []
    assert (
        lint_sglang_ids(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"], "deepseek")
        == []
    )


def test_case_fc03_lint_first_id_not_one():
    (problem,) = lint_sglang_ids([2, 16, 29], "deepseek")
    assert "start with 2, not 1" in problem and "by version" in problem
    # the reason: DeepSeek-class SGLang reads that list differently across 0.5.13
    assert from_engine_ids([2, 16, 29], "sglang", NUM_LAYERS, "deepseek", "0.5.12") == [3, 17, 30]
    assert from_engine_ids([2, 16, 29], "sglang", NUM_LAYERS, "deepseek", "0.5.13") == TRAINED
    with pytest.raises(ConventionError, match="pass --sglang-version"):
        from_engine_ids([2, 16, 29], "sglang", NUM_LAYERS, "deepseek")
