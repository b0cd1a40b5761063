"""The doctor's block-drafter checks (`doctor.block`), each passing on a DFlash drafter exported
for its target and failing, with the true cause, on the fault injected into one input: the block
setting of the launch line, the mask token, the target layers an engine reads, the draft layers'
attention, EAGLE-3 weights under a DFlash config (and DFlash weights under an EAGLE-3 one)."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import save_file

from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.dflash import DFlashDraft
from specdraft.doctor import run_doctor
from specdraft.export.dflash import export_dflash
from tests.support.dflash import tiny_dflash_cfg
from tests.support.doctor_helpers import edit_config
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import save_tiny_tokenizer, tiny_chat_tokenizer

MASK = 85  # the first id past the tiny tokenizer's 85, a row of the 128-row embedding
VLLM = 'vllm serve T --speculative-config \'{{"method": "dflash", "model": "D", "num_speculative_tokens": {}}}\''
SGLANG = "python -m sglang.launch_server --model-path T --speculative-algorithm {} --speculative-draft-model-path D"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(the drafter exported for vLLM with its manifest, the target directory with tokenizer)."""
    root = tmp_path_factory.mktemp("block")
    target = save_tiny_tokenizer(save_tiny_model("llama", root / "target", vocab_size=128))
    draft = DFlashDraft(tiny_dflash_cfg(vocab_size=128, mask_token_id=MASK))
    manifest = Manifest(
        draft=draft.cfg.to_dict(),
        target={"num_layers": 4, "hidden_size": 32, "vocab_size": 128},
        aux_layers=[1, 2, 3],
        tokenizer={"length": 85},
        extra={"method": "dflash"},
    )
    trained = save_dflash_draft(draft, root / "run" / "draft", manifest)
    return export_dflash(trained, root / "export", "vllm").out_dir, target


def copy_of(world, tmp_path, engine="vllm"):
    """A fresh export of the world's drafter for `engine`, for one test to damage."""
    return export_dflash(world[0], tmp_path / engine, engine, target=world[1]).out_dir


def finding(report, check):
    return report.finding(check)


def test_an_export_for_its_target_passes_every_check_that_can_run(world):
    export, target = world
    report = run_doctor(export, target=target, engine_args=VLLM.format(3))
    verdicts = {f.check: f.verdict for f in report.findings}
    assert verdicts == {
        "target_matches_training": "pass",
        "config_kind_matches_weights": "pass",
        "dflash_files_load": "pass",
        "block_size_matches_engine": "pass",
        "mask_token_matches_training": "pass",
        "tokenizer_matches_manifest": "pass",
        "chat_template_matches_manifest": "skip",  # the manifest records none
        "target_layers_as_engines_read": "pass",
        "draft_attention_as_engines_run": "pass",
        "block_acceptance_offline": "skip",  # no --samples
        "block_acceptance_online": "skip",  # no --server
    }
    assert "needs samples" in finding(report, "block_acceptance_offline").evidence


def test_an_unreachable_server_given_for_a_block_drafter_fails_naming_it(world):
    """--server with a DFlash drafter is checked (a fresh user once saw the same report with the
    server up and down): a server that does not answer fails."""
    report = run_doctor(world[0], target=world[1], server="http://127.0.0.1:9", server_wait_s=0)
    found = finding(report, "block_acceptance_online")
    assert found.verdict == "fail" and "http://127.0.0.1:9" in found.evidence, found


@pytest.mark.parametrize(
    "launch, verdict, said",
    [
        (VLLM.format(3), "pass", "num_speculative_tokens\": 3}' serves the trained block of 4"),
        (VLLM.format(2), "pass", "(of the 3 trained)"),
        (
            VLLM.format(7),
            "fail",
            "vLLM drafts 7 tokens a round; the drafter was trained on blocks of 4",
        ),
        (SGLANG.format("DFLASH") + " --speculative-num-draft-tokens 4", "pass", "block of 4"),
        (SGLANG.format("DFLASH"), "pass", "SGLang reads the block from config.json: 4"),
        (SGLANG.format("DFLASH") + " --speculative-num-draft-tokens 8", "fail", "SGLang drafts 8"),
        (SGLANG.format("DFLASH") + " --speculative-dflash-block-size 16", "fail", "drafts 16"),
        (SGLANG.format("EAGLE3"), "fail", "SGLang runs EAGLE3, not DFLASH"),
        (
            'vllm serve T --speculative-config \'{"model": "/d/dflash-b4", "num_speculative_tokens": 3}\'',
            "pass",
            "block of 4",
        ),
        (
            'vllm serve T --speculative-config \'{"model": "/d/x", "num_speculative_tokens": 3}\'',
            "fail",
            "vLLM runs no speculative method, not dflash",
        ),
    ],
)
def test_block_size_against_the_launch_line(world, launch, verdict, said):
    report = run_doctor(world[0], engine_args=launch)
    found = finding(report, "block_size_matches_engine")
    assert found.verdict == verdict and said in found.evidence, found


def test_a_mask_token_other_than_trainings_fails(world, tmp_path):
    export = copy_of(world, tmp_path)
    edit_config(export, lambda c: c["dflash_config"].update(mask_token_id=MASK - 1))
    found = finding(run_doctor(export, target=world[1]), "mask_token_matches_training")
    assert found.verdict == "fail"
    assert f"config.json's mask token {MASK - 1} is not training's ({MASK})" in found.evidence


def serving_tokenizer(tmp_path, world, *added):
    """The world's target with a tokenizer that has `added` tokens appended (specials named)."""
    target = tmp_path / "served"
    target.mkdir()
    for file in world[1].glob("*"):
        (target / file.name).write_bytes(file.read_bytes())
    tokenizer = tiny_chat_tokenizer()
    for token in added:
        tokenizer.add_special_tokens({"mask_token": token} if token == "<|MASK|>" else {})
        if token != "<|MASK|>":
            tokenizer.add_tokens([token])
    tokenizer.save_pretrained(target)
    return target


def test_the_mask_text_at_another_id_in_the_serving_tokenizer_fails(world, tmp_path):
    target = serving_tokenizer(tmp_path, world, "extra", "<|MASK|>")  # extra 85, <|MASK|> 86
    found = finding(run_doctor(world[0], target=target), "mask_token_matches_training")
    assert found.verdict == "fail"
    assert (
        "holds '<|MASK|>' at id 86, the drafter's mask token is 85: SGLang refuses"
        in found.evidence
    )


def test_a_serving_token_on_the_spare_mask_row_fails(world, tmp_path):
    target = serving_tokenizer(tmp_path, world, "extra")  # the mask's row is a token now
    found = finding(run_doctor(world[0], target=target), "mask_token_matches_training")
    assert (
        found.verdict == "fail"
        and "has 'extra' there: that token would read as the mask" in found.evidence
    )


def test_the_mask_token_added_at_its_trained_id_passes(world, tmp_path):
    target = serving_tokenizer(tmp_path, world, "<|MASK|>")  # z-lab's recipe: <|MASK|> = 85
    assert (
        finding(run_doctor(world[0], target=target), "mask_token_matches_training").verdict
        == "pass"
    )


def test_a_top_level_id_list_vllm_reads_first_fails_for_vllm_only(world, tmp_path):
    export = copy_of(world, tmp_path)
    edit_config(export, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 4]))
    both = finding(run_doctor(export), "target_layers_as_engines_read")
    assert both.verdict == "fail" and both.evidence.startswith(
        "vLLM captures [2, 3, 4] (specdraft indices; 0-based target layer ids [1, 2, 3]); "
        "the drafter was trained on [1, 2, 3] (specdraft indices; 0-based target layer ids "
        "[0, 1, 2])"
    )
    assert both.fix.startswith("write dflash_config.target_layer_ids [0, 1, 2] (0-based target")
    assert "gpu_model_runner.py" in both.evidence
    sglang = finding(run_doctor(export, engine="sglang"), "target_layers_as_engines_read")
    assert sglang.verdict == "pass"


def test_ids_other_than_trainings_fail_for_both_engines(world, tmp_path):
    export = copy_of(world, tmp_path)
    edit_config(export, lambda c: c["dflash_config"].update(target_layer_ids=[0, 1, 3]))
    found = finding(run_doctor(export), "target_layers_as_engines_read")
    assert found.verdict == "fail"
    assert (
        "SGLang captures [1, 2, 4] (specdraft indices; 0-based target layer ids [0, 1, 3]); "
        "vLLM captures [1, 2, 4] (specdraft indices; 0-based target layer ids [0, 1, 3]); "
        "the drafter was trained on [1, 2, 3] (specdraft indices; 0-based target layer ids"
        in found.evidence
    )


def test_ids_past_the_target_fail(world, tmp_path):
    small = save_tiny_model("llama", tmp_path / "small", vocab_size=128, num_layers=2)
    found = finding(run_doctor(world[0], target=small), "target_layers_as_engines_read")
    assert found.verdict == "fail"
    assert (
        "training layers [1, 2, 3] (specdraft indices) reach past the target's 2" in found.evidence
    )


def test_sliding_layers_sglang_runs_as_full_attention_fail(world, tmp_path):
    export = copy_of(world, tmp_path)
    edit_config(
        export,
        lambda c: (
            c.update(use_sliding_window=True, sliding_window=8, max_window_layers=0)
            or c.pop("layer_types")
        ),
    )
    report = run_doctor(export)
    found = finding(report, "draft_attention_as_engines_run")
    assert found.verdict == "fail"
    assert "SGLang runs layer 0 full, bidirectional, trained sliding 8, causal" in found.evidence
    assert "vLLM runs layer 1 full, bidirectional, trained sliding 8, causal" in found.evidence
    assert finding(report, "dflash_files_load").verdict == "fail"  # specdraft computes full only


def test_use_swa_vllm_runs_as_sliding_fails_for_vllm(world, tmp_path):
    export = copy_of(world, tmp_path)
    edit_config(
        export, lambda c: c.update(sliding_window=8) or c["dflash_config"].update(use_swa=True)
    )
    found = finding(run_doctor(export), "draft_attention_as_engines_run")
    assert found.verdict == "fail"
    assert found.evidence.startswith(
        "vLLM runs layer 0 sliding 8, causal, trained full, bidirectional"
    )
    assert "SGLang" not in found.evidence


def test_a_speculators_export_vllm_would_run_causally_fails(world, tmp_path):
    export = copy_of(world, tmp_path, "speculators")
    assert finding(run_doctor(export), "draft_attention_as_engines_run").verdict == "pass"
    edit_config(export, lambda c: c.update(sliding_window_non_causal=False))
    found = finding(run_doctor(export), "draft_attention_as_engines_run")
    assert found.verdict == "fail"
    assert "vLLM runs layer 0 full, causal, trained full, bidirectional" in found.evidence


def test_eagle3_weights_under_a_dflash_config_fail_with_that_cause(world, tmp_path):
    import torch

    export = copy_of(world, tmp_path)
    eagle = {"fc.weight": torch.zeros(32, 96), "midlayer.hidden_norm.weight": torch.ones(32)}
    save_file(eagle, export / "model.safetensors")
    report = run_doctor(export)
    kind = finding(report, "config_kind_matches_weights")
    assert kind.verdict == "fail" and "holds EAGLE-3 tensors (fc.weight, midlayer" in kind.evidence
    assert finding(report, "block_size_matches_engine").verdict == "skip"


def test_dflash_weights_under_an_eagle3_config_fail_with_that_cause(tmp_path):
    from specdraft.checkpoint import save_draft
    from tests.support.drafts import tiny_draft, tiny_manifest

    eagle = tiny_draft()
    out = save_draft(eagle, tmp_path / "eagle", layout="specdraft", manifest=tiny_manifest(eagle))
    save_file(DFlashDraft(tiny_dflash_cfg()).state_dict(), out / "model.safetensors")
    failed = [f for f in run_doctor(out).findings if f.verdict == "fail"]
    assert any("these are a DFlash drafter's tensors" in f.evidence for f in failed), failed
    assert json.loads((out / "config.json").read_text())["architectures"] != ["DFlashDraftModel"]


def test_a_speculators_drafter_without_its_targets_layer_count_skips(world, tmp_path):
    export = copy_of(world, tmp_path, "speculators")
    (export / "specdraft_manifest.json").unlink()
    report = run_doctor(export)
    load = finding(report, "dflash_files_load")
    assert load.verdict == "skip" and "the target's layer count is not in the file" in load.evidence
    assert "--target" in load.fix
    assert finding(run_doctor(export, target=world[1]), "dflash_files_load").verdict == "pass"


def retrained_config(world, tmp_path, block):
    """A copy of the world's export whose config.json says `block` (top-level and
    dflash_config) over a drafter the manifest records as trained on TINY_BLOCK."""
    export = copy_of(world, tmp_path)
    edit_config(
        export, lambda c: c.update(block_size=block) or c["dflash_config"].update(block_size=block)
    )
    return export


@pytest.mark.parametrize(
    "launch, verdict, said",
    [
        (VLLM.format(3), "pass", "num_speculative_tokens\": 3}' serves the trained block of 4"),
        (
            VLLM.format(7),
            "fail",
            "vLLM drafts 7 tokens a round; the drafter was trained on blocks of 4",
        ),
        (SGLANG.format("DFLASH") + " --speculative-num-draft-tokens 4", "pass", "block of 4"),
        (SGLANG.format("DFLASH") + " --speculative-num-draft-tokens 8", "fail", "blocks of 4"),
        (SGLANG.format("DFLASH"), "fail", "SGLang reads the block from config.json: 8"),
    ],
)
def test_a_config_block_other_than_the_trained_one_fails_and_the_launch_meets_training(
    world, tmp_path, launch, verdict, said
):
    export = retrained_config(world, tmp_path, 8)
    report = run_doctor(export, engine_args=launch)
    load = finding(report, "dflash_files_load")
    assert load.verdict == "fail"
    assert "config.json: block_size 8, but the drafter was trained on blocks of 4" in load.evidence
    assert "(specdraft_manifest.json)" in load.evidence
    found = finding(report, "block_size_matches_engine")
    assert found.verdict == verdict and said in found.evidence, found
    if verdict == "fail":
        assert "--speculative-num-draft-tokens 4" in found.fix or 'tokens": 3' in found.fix


def test_a_sliding_layer_type_is_named_by_index_and_value(world, tmp_path):
    """layer_types with one sliding entry: the load fail names that entry, not "layer_types set"
    (every export writes layer_types, all full_attention)."""
    export = copy_of(world, tmp_path)
    edit_config(export, lambda c: c.update(layer_types=["full_attention", "sliding_attention"]))
    found = finding(run_doctor(export), "dflash_files_load")
    assert found.verdict == "fail"
    assert "layer_types[1] 'sliding_attention' (every layer must be full_attention)" in (
        found.evidence
    )
    assert "layer_types set" not in found.evidence


def test_an_eagle3_config_over_a_dflash_export_names_the_config_first(world, tmp_path):
    """An EAGLE-3 export's config.json copied over a DFlash export (its weights and manifest
    DFlash's): the first fail names config.json as the cause and re-exporting (the command) as
    the fix, no EAGLE-3 check passes on DFlash weights, and the skips never ask for --target."""
    from specdraft.checkpoint import save_draft
    from tests.support.drafts import tiny_draft, tiny_manifest

    export = copy_of(world, tmp_path)
    eagle = tiny_draft()
    eagle_dir = save_draft(eagle, tmp_path / "e", layout="sglang", manifest=tiny_manifest(eagle))
    (export / "config.json").write_bytes((eagle_dir / "config.json").read_bytes())
    report = run_doctor(export, target=world[1])
    first = report.failed[0]
    assert first.check == "config_kind_matches_weights", report.failed
    assert first.evidence.startswith(
        "config.json names LlamaForCausalLMEagle3 (an EAGLE-3 architecture), not DFlashDraftModel; "
        "the weights are a DFlash drafter's and specdraft_manifest.json records a DFlash"
    )
    assert first.fix == (
        f"restore config.json: re-export it from its training run (specdraft export RUN/draft "
        f"{export} --engine sglang|vllm|speculators)"
    )
    said = " ".join(f"{f.evidence} {f.fix}" for f in report.findings)
    assert "delete specdraft_manifest.json" not in said and "RUN/draft, or an export" not in said
    checks = {f.check for f in report.findings}
    assert not checks & {"fc_width_matches_aux", "lm_head_untied", "values_finite"}
    assert [f.check for f in report.failed] == ["config_kind_matches_weights"]
    assert "--target" not in report.skips_enabled_by()
