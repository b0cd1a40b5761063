"""The norm flags of published EAGLE-3 variants in checkpoint configs: written by every layout and
read back (with or without a manifest), read as the engines read them (eagle_config first for
norm_before_fc, SGLang's legacy use_aux_norm / aux_norm_* names), a config that disagrees with its
manifest refused, and a sliding-window draft layer refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.checkpoint import LAYOUTS, CheckpointError, load_draft, save_draft
from specdraft.draft_config import NORM_FLAGS
from tests.support.doctor_helpers import edit_config
from tests.support.drafts import FLAG_COMBINATIONS, flag_id, tiny_draft, tiny_manifest


def flags_of(cfg) -> dict[str, bool]:
    return {name: getattr(cfg, name) for name in NORM_FLAGS}


def outputs(model) -> torch.Tensor:
    """The drafter's logits and next hidden state on fixed inputs (first step, then a later one)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 128, (1, 4), generator=gen)
    first = model(ids, torch.randn(1, 4, 96, generator=gen), torch.arange(4), first_step=True)
    later = model(ids, first.hidden, torch.arange(1, 5), first_step=False)
    return torch.cat([first.logits, first.hidden, later.logits, later.hidden], -1)


@pytest.mark.parametrize("flags", FLAG_COMBINATIONS, ids=flag_id)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_writes_the_flags_and_reads_them_back(tmp_path, layout, flags):
    model = tiny_draft(**flags)
    save_draft(
        model,
        tmp_path / "d",
        layout=layout,
        manifest=tiny_manifest(model) if layout == "specdraft" else None,
        verifier="/models/target",
    )
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["norm_before_residual"] is flags["norm_before_residual"]
    assert {k for k in NORM_FLAGS[1:] if config.get(k)} == {k for k in NORM_FLAGS[1:] if flags[k]}
    loaded = load_draft(tmp_path / "d", target_num_layers=5).model
    assert flags_of(loaded.cfg) == flags
    loaded.load_target_embedding(model.embed_tokens.weight)  # shared: not in the file
    torch.testing.assert_close(outputs(loaded), outputs(model), rtol=0, atol=0)


def test_norm_before_fc_under_eagle_config_and_legacy_fc_norm_names_are_read(tmp_path):
    """SGLang's legacy names: use_aux_norm and aux_norm_low/mid/high (its legacy_name_map)."""
    model = tiny_draft(norm_before_fc=True, fc_norm=True)
    save_draft(model, tmp_path / "d", layout="sglang")

    def legacy(config):
        config.pop("norm_before_fc"), config.pop("fc_norm")
        config["eagle_config"]["norm_before_fc"] = True
        config["use_aux_norm"] = True

    edit_config(tmp_path / "d", legacy)
    file = tmp_path / "d" / "model.safetensors"
    names = {
        "fc_norm.0.": "aux_norm_low.",
        "fc_norm.1.": "aux_norm_mid.",
        "fc_norm.2.": "aux_norm_high.",
    }
    tensors = {
        next((names[p] + k[len(p) :] for p in names if k.startswith(p)), k): v
        for k, v in load_file(str(file)).items()
    }
    assert "aux_norm_mid.weight" in tensors
    save_file(tensors, str(file))
    loaded = load_draft(tmp_path / "d", target_num_layers=5).model
    assert loaded.cfg.norm_before_fc and loaded.cfg.fc_norm
    loaded.load_target_embedding(model.embed_tokens.weight)  # shared: not in the file
    torch.testing.assert_close(outputs(loaded), outputs(model), rtol=0, atol=0)


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            lambda c: c.update(norm_output=True),
            r"norm_output True \(config.json\) vs False \(manifest\)",
        ),
        (
            lambda c: c.update(norm_before_residual="yes"),
            'norm_before_residual: "yes" must be true or false',
        ),
        (lambda c: c.update(fc_norm=False, use_aux_norm=True), "disagree"),
    ],
)
def test_a_config_that_says_another_drafter_is_refused(tmp_path, edit, match):
    model = tiny_draft()
    save_draft(model, tmp_path / "d", layout="specdraft", manifest=tiny_manifest(model))
    edit_config(tmp_path / "d", edit)
    with pytest.raises(CheckpointError, match=match):
        load_draft(tmp_path / "d")


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_a_sliding_window_draft_layer_is_refused(tmp_path, layout):
    """speculators' trainer writes layer_types ["sliding_attention"] and sliding_window 2048."""
    save_draft(tiny_draft(), tmp_path / "d", layout=layout, verifier="/models/target")

    def slide(config):
        layer = config["transformer_layer_config"] if layout == "speculators" else config
        layer.update(
            layer_types=["sliding_attention"], sliding_window=2048, use_sliding_window=True
        )

    edit_config(tmp_path / "d", slide)
    with pytest.raises(
        CheckpointError,
        match=r"layer_types \['sliding_attention'\] with sliding_window 2048: "
        "vLLM and speculators window",
    ):
        load_draft(tmp_path / "d", target_num_layers=5)
    edit_config(
        tmp_path / "d",
        lambda c: (c.get("transformer_layer_config") or c).update(
            layer_types=["full_attention"], use_sliding_window=False
        ),
    )
    assert load_draft(tmp_path / "d", target_num_layers=5).model.cfg.aux_layers == (2, 3, 4)


def test_a_speculators_config_without_norm_before_residual_is_refused_by_loader_and_doctor(
    tmp_path,
):
    """vLLM reads an omitted norm_before_residual as true, the speculators library as false."""
    from specdraft.doctor import run_doctor

    save_draft(tiny_draft(), tmp_path / "d", layout="speculators", verifier="/models/target")
    edit_config(tmp_path / "d", lambda c: c.pop("norm_before_residual"))
    with pytest.raises(
        CheckpointError,
        match="a speculators config without norm_before_residual: vLLM 0.32 "
        "reads it as true, the speculators library as false",
    ) as refused:
        load_draft(tmp_path / "d", target_num_layers=5)
    finding = run_doctor(tmp_path / "d").finding("specdraft_loads")
    assert finding.verdict == "fail" and finding.evidence.endswith(
        str(refused.value)
    )  # the loader's words
