"""specdraft.targets.classes: a target's rule class from its config or from what a manifest or
capture store recorded, records written before a class had its rule included."""

from __future__ import annotations

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specdraft.targets.classes import (
    DEFAULT_CLASSES,
    WRAPPER_TEXT_MODEL_TYPES,
    recorded_target_class,
)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"architecture": "Qwen3ForCausalLM", "target_class": "llama"}, "qwen"),
        ({"architecture": "Qwen2_5_VLForConditionalGeneration", "target_class": None}, "qwen"),
        ({"architecture": "Qwen3VLForConditionalGeneration"}, "qwen3_vl"),
        ({"architecture": "Llama4ForConditionalGeneration"}, "llama4"),
        ({"architecture": "Mistral3ForConditionalGeneration"}, "llava"),
        ({"architecture": "MyOwnForCausalLM", "target_class": "deepseek"}, "deepseek"),
        ({"num_layers": 5}, None),
    ],
)
def test_a_recorded_target_reads_its_class_from_its_architecture_first(record, expected):
    assert recorded_target_class(record) == expected


def test_the_wrappers_text_model_types_are_transformers_defaults():
    for model_type, text_model_type in WRAPPER_TEXT_MODEL_TYPES.items():
        assert model_type in DEFAULT_CLASSES
        assert CONFIG_MAPPING[model_type]().get_text_config().model_type == text_model_type
    for model_type in set(DEFAULT_CLASSES) - set(WRAPPER_TEXT_MODEL_TYPES):
        assert CONFIG_MAPPING[model_type]().get_text_config().model_type == model_type
