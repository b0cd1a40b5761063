"""A drafter given where a target model belongs, or a target where a drafter belongs, gets the same
one line and exit 1 from every command (`checkpoint.wrong_dir_message`), never a tokenizer error
or a table of wrong fixes; `inspect` names the layout it sees the way the files are written."""

from __future__ import annotations

import json

import pytest

from specdraft.checkpoint import (
    DirKind,
    classify_dir,
    describe_layout,
    load_draft,
    save_draft,
    wrong_dir_message,
)
from specdraft.doctor import run_doctor
from specdraft.targets import load_target
from tests.support.cli import cli_args, invoke
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401

DRAFTER_DIRS = "pass the drafter directory (specdraft train's OUT/draft or an export), and this directory as --target"
SGLANG_MANIFEST = (
    "SGLang layout (official EAGLE-3, loaded by SGLang and vLLM; the one specdraft trains in) + "
    "specdraft manifest (convert's --layout specdraft)"
)
BARE_SGLANG = (
    "SGLang layout (official EAGLE-3, loaded by SGLang and vLLM; the one specdraft trains in), no "
    "specdraft manifest"
)
SPECULATORS = "speculators layout (loaded by vLLM)"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir with manifest, its target, speculators drafter naming a verifier, bare sglang drafter)."""
    root = tmp_path_factory.mktemp("dir-kinds")
    draft, target = draft_checkpoint(root)
    model = load_draft(draft).model
    save_draft(model, root / "spec", layout="speculators", verifier="/models/llama-5")
    save_draft(model, root / "bare", layout="sglang")
    return draft, target, root / "spec", root / "bare"


def write_config(path, config) -> str:
    path.mkdir()
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def test_classify_dir(world, tmp_path):
    draft, target, spec, bare = world
    assert classify_dir(draft) == DirKind(
        "drafter", "its config.json says architectures ['LlamaForCausalLMEagle3']", str(target)
    )
    assert classify_dir(spec) == DirKind(
        "drafter", "its config.json has speculators_model_type = 'eagle3'", "/models/llama-5"
    )
    assert classify_dir(bare).trained_for is None
    assert classify_dir(target) == DirKind("target", "LlamaForCausalLM, 5 layers")
    # EAGLE's own repo writes LlamaForCausalLM with drafter keys: still a drafter, never a target.
    eagle = write_config(
        tmp_path / "eagle", {"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}
    )
    assert classify_dir(eagle) == DirKind("drafter", "its config.json has draft_vocab_size = 32000")
    vlm = write_config(
        tmp_path / "vlm", {"model_type": "llava", "text_config": {"num_hidden_layers": 3}}
    )
    assert classify_dir(vlm) == DirKind("target", "model_type llava, 3 layers")
    for name, config in (("empty", {}), ("bad", "{"), ("list", "[]")):
        assert classify_dir(write_config(tmp_path / name, config)) == DirKind("other")
    assert classify_dir(tmp_path / "nowhere") == DirKind("other")
    assert (
        wrong_dir_message(draft, "drafter") is None and wrong_dir_message(target, "target") is None
    )
    assert wrong_dir_message(tmp_path / "empty", "drafter") is None


def drafter_line(given: str, path, says: str, which: str) -> str:
    return (
        f"error: {given}{path} is an EAGLE-3 drafter ({says}), not a target model: pass the target "
        f"model directory ({which})"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--target", "{draft}", "--prompt", "hi"],
        ["serve", "--target", "{draft}", "--draft", "{draft}"],
        ["tune", "--target", "{draft}", "--draft", "{draft}"],
        ["doctor", "{draft}", "--target", "{draft}"],
        ["capture", "{draft}", "data.jsonl", "out"],
    ],
)
def test_a_drafter_as_target_is_one_line_naming_the_recorded_target(world, args):
    draft, target, _, _ = world
    result = invoke([a.replace("{draft}", str(draft)) for a in args])
    given = "" if args[0] == "capture" else "--target "  # capture's TARGET is an argument
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        drafter_line(
            given,
            draft,
            "its config.json says architectures ['LlamaForCausalLMEagle3']",
            f"the one the drafter was trained for: {target}",
        )
    ]


def test_a_drafter_as_target_in_the_library_and_without_a_manifest(world):
    draft, target, spec, bare = world
    with pytest.raises(
        ValueError, match=f"--target {draft} is an EAGLE-3 drafter .* trained for: {target}"
    ):
        run_doctor(draft, target=draft)
    with pytest.raises(ValueError, match=f"^{spec} is an EAGLE-3 drafter .*speculators_model_type"):
        load_target(spec)
    result = invoke(["doctor", str(draft), "--target", str(spec)])
    assert result.exit_code == 1 and "FAIL" not in result.output, result.output
    assert result.output.strip() == drafter_line(
        "--target ",
        spec,
        "its config.json has speculators_model_type = 'eagle3'",
        "the one the drafter was trained for: /models/llama-5",
    )
    assert wrong_dir_message(bare, "target").endswith(
        "(the one the drafter was trained for; the drafter does not record it)"
    )


@pytest.mark.parametrize(
    "args, given",
    [
        (["inspect", "{t}"], ""),
        (["convert", "{t}", "{out}", "--layout", "sglang"], ""),
        (["export", "{t}", "{out}", "--engine", "sglang"], ""),
        (["doctor", "{t}"], ""),
        (cli_args("generate", target="{t}", draft="{t}", prompt="hi"), "--draft "),
        (["serve", "--target", "{t}", "--draft", "{t}"], "--draft "),
        (["tune", "--target", "{t}", "--draft", "{t}"], "--draft "),
    ],
)
def test_a_target_as_drafter_is_one_line_naming_the_fix(world, tmp_path, args, given):
    _, target, _, _ = world
    result = invoke(
        [a.replace("{t}", str(target)).replace("{out}", str(tmp_path / "out")) for a in args]
    )
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"error: {given}{target} is a transformers target model (LlamaForCausalLM, 5 layers), not an EAGLE-3 "
        f"drafter: {DRAFTER_DIRS}"
    ]
    assert not (tmp_path / "out").exists()


def test_inspect_names_the_layout_it_sees(world, tmp_path):
    draft, target, spec, bare = world
    for args in (
        cli_args("export", draft, tmp_path / "sglang-export", engine="sglang", target=target),
        cli_args("export", draft, tmp_path / "vllm-export", engine="vllm", target=target),
        ["convert", str(draft), str(tmp_path / "as-sglang"), "--layout", "sglang"],
        ["convert", str(draft), str(tmp_path / "as-specdraft"), "--layout", "specdraft"],
        ["convert", str(draft), str(tmp_path / "as-speculators"), "--layout", "speculators"],
    ):
        result = invoke(args)
        assert result.exit_code == 0, result.output
        if args[0] == "convert":  # convert names what it wrote as inspect will
            on_disk = {
                "speculators": SPECULATORS + " + specdraft manifest",
                "sglang": BARE_SGLANG,
                "specdraft": SGLANG_MANIFEST,
            }[args[-1]]
            assert f"wrote {args[2]} ({on_disk}):" in result.output.replace("\n", "")
    # The "specdraft" layout is the SGLang files plus the manifest: the same bytes, less the manifest.
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "as-sglang" / name).read_bytes() == (
            tmp_path / "as-specdraft" / name
        ).read_bytes()
    assert not (tmp_path / "as-sglang" / "specdraft_manifest.json").exists()
    # a vLLM export is the same layout, which vLLM loads as SGLang does (conventions.DRAFT_LOADING)
    expected = {
        draft: SGLANG_MANIFEST,
        tmp_path / "sglang-export": SGLANG_MANIFEST,
        tmp_path / "vllm-export": SGLANG_MANIFEST,
        tmp_path / "as-sglang": BARE_SGLANG,
        tmp_path / "as-specdraft": SGLANG_MANIFEST,
        tmp_path / "as-speculators": SPECULATORS + " + specdraft manifest",
        spec: SPECULATORS + ", no specdraft manifest",
        bare: BARE_SGLANG,
    }
    for path, layout in expected.items():
        result = invoke(["inspect", str(path), "--target", str(target)])
        assert result.exit_code == 0, result.output
        assert result.output.splitlines()[0] == f"{path}: {layout}"
        assert "specdraft layout" not in result.output
    assert describe_layout("specdraft", True) == SGLANG_MANIFEST
    with pytest.raises(ValueError, match="unknown layout"):
        describe_layout("official", False)


def test_an_unrelated_model_directory_is_left_to_the_loader(tmp_path):
    """A config that is neither (e.g. "{}") passes the option checks; the command reports it."""
    other = write_config(tmp_path / "other", {})
    result = invoke(["inspect", str(other)])
    assert result.exit_code == 1 and "not an EAGLE-3 draft config" in result.output, result.output


def test_a_run_directory_or_a_store_where_a_drafter_belongs_names_what_to_pass(world, tmp_path):
    """`export RUN OUT` / `generate --draft STORE`: one line naming RUN/draft, or saying a store
    is trained on first (was "config.json: missing")."""
    import shutil

    draft, target, _, _ = world
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(draft, run / "draft")
    store = tmp_path / "store"
    store.mkdir()
    (store / "index.json").write_text("{}")
    result = invoke(["export", str(run), str(tmp_path / "out"), "--engine", "sglang"])
    assert result.exit_code == 1, result.output
    assert " ".join(result.output.split()) == (
        f"error: {run} is a training run directory, not a drafter: pass "
        f"{run / 'draft'} (the drafter specdraft train writes at the end)"
    )
    result = invoke(cli_args("generate", target=target, draft=store, prompt="a"))
    assert result.exit_code == 1, result.output
    assert (
        f"--draft {store} is a capture store (specdraft capture's index.json), not a drafter: train one on it "
        f"(specdraft train {store} OUT), then pass OUT/draft"
    ) in " ".join(result.output.split())
    result = invoke(["generate", "--target", str(store), "--prompt", "a"])
    assert result.exit_code == 1 and f"--target {store} is a capture store" in " ".join(
        result.output.split()
    )
    assert wrong_dir_message(store, "target", "--target") == (
        f"--target {store} is a capture store (specdraft capture's index.json), not a target model: pass the "
        "target's transformers directory (the store's index.json records its path)"
    )
