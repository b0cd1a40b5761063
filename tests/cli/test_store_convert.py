"""`specdraft store convert` through the CLI: peers' stores in and out, `train` on a converted
store, and one line naming the file and the field for bad input."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specdraft.capture.stage import CaptureConfig, capture_dataset
from specdraft.checkpoint import load_draft
from specdraft.cli import app
from specdraft.doctor.samples import read_samples
from tests.support.cli import cli_args
from tests.support.tiny_tokenizer import CHAT


@pytest.fixture(scope="module")
def store(chat_target_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("convert")
    data = tmp / "chats.jsonl"
    data.write_text(
        "".join(json.dumps({"messages": c}) + "\n" for c in [CHAT, CHAT[:3], CHAT[1:3], CHAT])
    )
    capture_dataset(
        CaptureConfig(str(chat_target_dir), str(data), str(tmp / "store"), max_length=30)
    )
    return tmp / "store"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def to_specdraft(peer_store, out, target, aux_layers: str, **options):
    """`store convert PEER_STORE OUT --to specdraft --target TARGET --aux-layers AUX`."""
    args = cli_args("store", "convert", peer_store, out, to="specdraft", target=target, **options)
    return invoke(*args, "--aux-layers", aux_layers)


def train_briefly(store, run, steps: int):
    """`train STORE RUN` for `steps` steps of batch 2, one TTT step, sequences up to 64 tokens."""
    return invoke(
        *cli_args("train", store, run, steps=steps, batch_size=2, ttt_steps=1, max_length=64)
    )


@pytest.mark.parametrize("peer, aux_ids", [("speculators", "1,2,3"), ("specforge", "0,1,2")])
def test_train_runs_on_a_store_converted_from_a_peer(
    store, chat_target_dir, tmp_path, peer, aux_ids
):
    out = invoke("store", "convert", store, tmp_path / peer, "--to", peer)
    assert out.exit_code == 0, out.output
    assert f"wrote 4 samples as a {peer} store" in out.output
    back = to_specdraft(tmp_path / peer, tmp_path / "back", chat_target_dir, aux_ids)
    assert back.exit_code == 0, back.output
    assert "aux layers (specdraft indices) [1, 2, 3]" in back.output
    doctor_samples = [
        read_samples(p, lambda: None, {}, 10, 64).samples for p in (store, tmp_path / "back")
    ]
    assert doctor_samples[0] == doctor_samples[1] and len(doctor_samples[0]) == 4
    run = train_briefly(tmp_path / "back", tmp_path / "run", 2)
    assert run.exit_code == 0, run.output
    assert load_draft(tmp_path / "run" / "draft").manifest.aux_layers == [1, 2, 3]


def test_bad_peer_stores_are_one_line_naming_file_and_field(store, chat_target_dir, tmp_path):
    assert (
        invoke("store", "convert", store, tmp_path / "spec", "--to", "speculators").exit_code == 0
    )
    hs = tmp_path / "spec" / "hidden_states" / "hs_1.safetensors"
    tensors = load_file(str(hs))
    save_file({"hidden_states": tensors["hidden_states"]}, str(hs))
    out = to_specdraft(tmp_path / "spec", tmp_path / "x", chat_target_dir, "1,2,3")
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert out.output.strip() == (
        f"error: {hs}: not a speculators hidden-state file (missing token_ids; "
        f"expected exactly hidden_states, token_ids)"
    )
    save_file({**tensors, "hidden_states": tensors["hidden_states"][:, :2].contiguous()}, str(hs))
    out = to_specdraft(tmp_path / "spec", tmp_path / "x", chat_target_dir, "1,2,3")
    assert out.exit_code == 1 and "sample 1: field aux_hidden has shape" in out.output
    hs.write_bytes(b"not safetensors")
    out = invoke(
        "store",
        "convert",
        tmp_path / "spec",
        tmp_path / "x",
        "--to",
        "specforge",
        "--target",
        chat_target_dir,
    )
    assert (
        out.exit_code == 2
        and f"{hs}: cannot be read as safetensors, cut short or damaged (" in out.output
    )
    assert "; restore the file, or write the store again with the tool that made it" in out.output
    assert not (tmp_path / "x").exists()


def test_convert_refuses_a_same_format_or_non_empty_destination(store, tmp_path):
    out = invoke("store", "convert", store, tmp_path / "y", "--to", "specdraft")
    assert out.exit_code == 1 and "already a specdraft store" in out.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    out = invoke("store", "convert", store, tmp_path / "full", "--to", "specforge")
    assert out.exit_code == 1 and "not an empty directory" in out.output
    assert invoke("store", "convert", store, tmp_path / "z", "--to", "nope").exit_code == 2


def test_the_options_choices_are_the_librarys():
    from typing import get_args

    from specdraft.capture.convert import CONVENTIONS, FORMATS
    from specdraft.cli.store import AuxConvention, StoreFormat

    assert get_args(StoreFormat) == FORMATS and get_args(AuxConvention) == CONVENTIONS


def test_aux_layers_take_the_named_forms_of_the_other_commands(store, chat_target_dir, tmp_path):
    assert invoke("store", "convert", store, tmp_path / "sf", "--to", "specforge").exit_code == 0
    for i, (given, options) in enumerate(
        [
            ("sglang:0,1,2", {}),
            ("vllm:1,2,3", {}),
            ("specdraft:1,2,3", {}),
            ("1,2,3", {"aux_convention": "specdraft"}),
            ("0,1,2", {}),
        ]
    ):  # last: SpecForge's sglang
        out = to_specdraft(tmp_path / "sf", tmp_path / f"b{i}", chat_target_dir, given, **options)
        assert out.exit_code == 0 and "aux layers (specdraft indices) [1, 2, 3]" in out.output, (
            given,
            out.output,
        )
    both = to_specdraft(
        tmp_path / "sf", tmp_path / "x", chat_target_dir, "vllm:1,2,3", aux_convention="sglang"
    )
    assert (
        both.exit_code == 2 and "names the vllm convention, --aux-convention sglang" in both.output
    )
    bad = to_specdraft(tmp_path / "sf", tmp_path / "x", chat_target_dir, "eagle:1,2,3")
    assert (
        bad.exit_code == 2
        and "'eagle' is no aux-id convention" in bad.output
        and not (tmp_path / "x").exists()
    )


@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_a_round_trip_store_names_its_layers_for_train_and_doctor(store, tmp_path, peer):
    """specdraft -> peer -> specdraft without --target / --aux-layers: the index names the captured
    layers, training reads them into the manifest, and doctor --samples sees the drafter's own data."""
    assert invoke("store", "convert", store, tmp_path / peer, "--to", peer).exit_code == 0
    back = invoke("store", "convert", tmp_path / peer, tmp_path / "back", "--to", "specdraft")
    assert back.exit_code == 0 and "aux layers (specdraft indices) [1, 2, 3]" in back.output, (
        back.output
    )
    index = json.loads((tmp_path / "back" / "index.json").read_text())
    assert index == json.loads((store / "index.json").read_text()) and index["aux_layers"] == [
        1,
        2,
        3,
    ]
    run = train_briefly(tmp_path / "back", tmp_path / "run", 1)
    assert run.exit_code == 0, run.output
    manifest = load_draft(tmp_path / "run" / "draft").manifest
    assert manifest.aux_layers == [1, 2, 3]
    assert (
        read_samples(tmp_path / "back", lambda: None, {}, 10, 64).data_hash
        == manifest.data_hash
        is not None
    )
