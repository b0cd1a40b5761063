"""The target side against SGLang itself: SGLang's target class for a tiny target, given
`set_eagle3_layers_to_capture(ids)` with the ids of specdraft's export (its eagle_config, SGLang's
convention for this version: ENGINE_RULES), hands the drafter the aux hidden states that
specdraft's capture store holds for the same prompt (float32, within 1e-5)."""

from __future__ import annotations

import pytest
import torch

from specdraft.capture.store import CaptureStore, StoreSettings
from specdraft.capture.write import write_store
from specdraft.conventions import ConventionError, captured_by, parse_version, to_engine_ids
from specdraft.data.render import Sample
from specdraft.errors import SpecdraftError
from specdraft.export import export_draft
from specdraft.targets import load_target
from tests.sglang_tier import engine
from tests.sglang_tier.worlds import AUX_LAYERS, NUM_LAYERS, sglang_export
from tests.support.doctor_helpers import (  # noqa: F401 (one_thread: autouse, one torch thread)
    draft_checkpoint,
    one_thread,
)

PROMPT = [5, 17, 99, 3, 42, 8, 77, 61, 23, 110, 4, 56]
TARGET_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
RULE_CLASS = {
    "llama": "llama",
    "qwen3": "qwen",
    "deepseek_v3": "deepseek",
}  # ENGINE_RULES' classes
# SGLang's DeepSeek-V2/V3 class does not build on the CPU (0.5.10 - 0.5.23): its CPU rope,
# rotary_embedding/factory.py get_rope_cpu, asserts rope_scaling is not None (YaRN only).
NO_CPU_BUILD = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="deepseek_v2.py's rope: rotary_embedding/factory.py get_rope_cpu asserts rope_scaling",
)


def store_aux(target_dir, tmp_path, aux_layers=AUX_LAYERS) -> torch.Tensor:
    """aux_hidden [T, 3·H] of PROMPT in specdraft's capture store (transformers, float32)."""
    settings = StoreSettings(aux_layers, dtype=torch.float32)
    write_store(
        load_target(target_dir), [Sample(PROMPT, [1] * len(PROMPT))], tmp_path / "store", settings
    )
    return CaptureStore(tmp_path / "store")[0]["aux_hidden"]


@pytest.mark.parametrize(
    "arch", ["llama", "qwen3", pytest.param("deepseek_v3", marks=NO_CPU_BUILD)]
)
def test_sglang_hands_the_drafter_the_stored_aux_states(tmp_path, arch):
    export = sglang_export(tmp_path, arch)
    ids = export.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert captured_by(
        export.config, "sglang", NUM_LAYERS, RULE_CLASS[arch], engine.VERSION
    ) == list(AUX_LAYERS)
    loaded = engine.load(export.target, draft=False, dtype="float32")
    assert type(loaded.model).__name__ == TARGET_CLASSES[arch] and loaded.unwritten == []
    loaded.model.set_eagle3_layers_to_capture(ids)
    out = engine.Runner(loaded.model).extend(torch.tensor(PROMPT))
    torch.testing.assert_close(
        out.hidden_states, store_aux(export.target, tmp_path), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sglang_captures_the_embeddings_where_the_rules_say(tmp_path, arch):
    """Index 0 (id -1): SGLang's Qwen2/Qwen3 classes capture the embeddings from 0.5.10
    (qwen2.py), Llama's from 0.5.22 (conventions/rules_qwen_gemma.py, rules.py). Where the rule
    of the pinned version allows it, the export's ids make SGLang hand over the stored states;
    elsewhere export refuses the list."""
    aux = (0, 2, 4)
    draft, target = draft_checkpoint(tmp_path, arch=arch, num_layers=NUM_LAYERS, aux=aux)
    try:
        ids = to_engine_ids(list(aux), "sglang", NUM_LAYERS, RULE_CLASS[arch], engine.VERSION)
    except ConventionError:
        assert arch == "llama" and parse_version(engine.VERSION) < (0, 5, 22)
        with pytest.raises(SpecdraftError, match="embeddings"):
            export_draft(
                draft,
                tmp_path / "out",
                engine="sglang",
                target=target,
                sglang_version=engine.VERSION,
            )
        return
    export = export_draft(
        draft, tmp_path / "out", engine="sglang", target=target, sglang_version=engine.VERSION
    )
    assert export.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids == [-1, 1, 3]
    loaded = engine.load(target, draft=False, dtype="float32")
    loaded.model.set_eagle3_layers_to_capture(ids)
    out = engine.Runner(loaded.model).extend(torch.tensor(PROMPT))
    torch.testing.assert_close(
        out.hidden_states, store_aux(target, tmp_path, aux), rtol=1e-5, atol=1e-5
    )
