"""A drafter with a manifest whose config.json declares other values than training's (the
engines build the drafter from config.json, specdraft from the manifest): the one reader
(`config_read.refuse_other_declared`) refuses it naming the field and both values, so the loader
and doctor's specdraft_loads agree; a serving limit (max_position_embeddings) may change."""

from __future__ import annotations

import pytest

from specdraft.checkpoint import CheckpointError, load_draft
from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, edit_config, one_thread  # noqa: F401


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    """(draft dir, target dir) of a seeded drafter with its manifest."""
    return draft_checkpoint(tmp_path_factory.mktemp("declared") / "m")


def layer_of(config: dict) -> dict:
    """The dict holding the layer's fields (speculators nests them)."""
    return config.get("transformer_layer_config", config)


@pytest.mark.parametrize("layout", ["sglang", "vllm", "speculators"])
@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("rms_norm_eps", 0.5, "rms_norm_eps 0.5 (config.json) vs 1e-06 (manifest)"),
        ("rope_theta", 1234.0, "rope_theta 1234.0 (config.json) vs 10000.0 (manifest)"),
        ("intermediate_size", 48, "intermediate_size 48 (config.json) vs 64 (manifest)"),
    ],
)
def test_a_value_other_than_trainings_is_refused_by_loader_and_doctor(
    drafter, tmp_path, layout, key, value, said
):
    draft, target = drafter
    out = tmp_path / layout
    export_draft(draft, out, engine=layout, target=target)
    edit_config(out, lambda c: layer_of(c).update({key: value}))
    with pytest.raises(CheckpointError) as raised:
        load_draft(out)
    message = str(raised.value)
    assert message.startswith(f"{out}/config.json: ") and said in message, message
    assert "the engines read config.json" in message
    loads = run_doctor(out, target=target).finding("specdraft_loads")
    assert loads.verdict == "fail" and said in loads.evidence


def test_a_string_where_a_number_is_declared_is_refused(drafter, tmp_path):
    draft, target = drafter
    export_draft(draft, tmp_path / "x", engine="vllm", target=target)
    edit_config(tmp_path / "x", lambda c: c.update(hidden_size=str(c["hidden_size"])))
    with pytest.raises(CheckpointError, match="config.json"):
        load_draft(tmp_path / "x")


def test_a_serving_limit_may_change(drafter, tmp_path):
    draft, target = drafter
    export_draft(draft, tmp_path / "x", engine="vllm", target=target)
    edit_config(tmp_path / "x", lambda c: c.update(max_position_embeddings=8192))
    assert load_draft(tmp_path / "x").model.cfg.hidden_size > 0
