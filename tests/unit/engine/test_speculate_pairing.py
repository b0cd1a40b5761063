"""`specdraft generate --target A --draft D` with D trained for another target B: one error that
says so, naming both targets and their sizes, before any tensor shape meets the target (the
shared embedding used to fail first with a bare shape mismatch)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specdraft.checkpoint import MANIFEST_FILE, convert_draft
from specdraft.cli import app
from specdraft.engine.load import load_engine
from specdraft.engine.spec_config import SpecConfig
from tests.support.cli import cli_args
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.serve_helpers import word_tokenizer
from tests.support.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def trained_for_b(tmp_path_factory):
    """(drafter dir, the target B it was trained for): 5 layers, hidden 32, vocab 128."""
    draft, target_b = draft_checkpoint(tmp_path_factory.mktemp("b"), num_layers=5)
    return draft, target_b


def other_target(path, **sizes):
    """A tiny Llama target A with a word tokenizer (generate loads it from the directory)."""
    target = save_tiny_model(
        "llama", path, **{"num_layers": 5, "hidden_size": 32, "vocab_size": 128, **sizes}
    )
    word_tokenizer().save_pretrained(target)
    return target


def generate(target, draft):
    return CliRunner().invoke(
        app,
        cli_args("generate", target=target, draft=draft, prompt="w1 w2 w3", max_new_tokens=4),
    )


@pytest.mark.parametrize(
    "sizes, given, differ",
    [
        ({"hidden_size": 48}, "5 layers, hidden 48, vocab 128", "hidden_size differs"),
        ({"vocab_size": 96}, "5 layers, hidden 32, vocab 96", "vocab_size differs"),
        (
            {"num_layers": 6, "hidden_size": 48},
            "6 layers, hidden 48, vocab 128",
            "num_layers, hidden_size differ",
        ),
    ],
)
def test_generate_names_the_target_the_drafter_was_trained_for(
    trained_for_b, tmp_path, sizes, given, differ
):
    draft, target_b = trained_for_b
    target_a = other_target(tmp_path / "a", **sizes)
    result = generate(target_a, draft)
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert text.startswith(
        f"error: {draft}: this drafter was trained for another target: "
        f"{target_b.resolve()} (5 layers, hidden 32, vocab 128), not {target_a} ({given}; "
        f"{differ}); pass the target it was trained for, or a drafter trained for {target_a}"
    ), text
    assert "shape" not in text


def test_a_drafter_without_manifest_is_refused_by_the_sizes_it_was_built_for(
    trained_for_b, tmp_path
):
    """The official (sglang) layout has no manifest: the sizes in its config still name the mismatch."""
    draft, _ = trained_for_b
    official = tmp_path / "official"
    convert_draft(draft, official, layout="sglang", target_num_layers=5)
    assert not (official / MANIFEST_FILE).exists()  # the official layout has none
    target_a = other_target(tmp_path / "a", hidden_size=48)
    with pytest.raises(
        ValueError,
        match=r"this drafter was trained for another target: one of 5 layers, hidden 32, "
        r"vocab 128 \(path not recorded\), not .*a \(5 layers, hidden 48, vocab 128; "
        r"hidden_size differs\)",
    ):
        load_engine(target_a, official, SpecConfig.chain(3))


def test_the_target_it_was_trained_for_still_generates(trained_for_b):
    draft, target_b = trained_for_b
    word_tokenizer().save_pretrained(target_b)
    result = generate(target_b, draft)
    assert result.exit_code == 0, result.output
    assert "speculative decoding (steps 3, topk 1, draft tokens 4)" in result.output


def test_serve_refuses_it_the_same_way_before_binding(trained_for_b, tmp_path):
    draft, target_b = trained_for_b
    target_a = other_target(tmp_path / "a", hidden_size=48)
    result = CliRunner().invoke(app, cli_args("serve", target=target_a, draft=draft, port=1))
    assert result.exit_code == 1, result.output
    assert (
        f"this drafter was trained for another target: {target_b.resolve()} (5 layers, hidden 32, vocab 128)"
        in " ".join(result.output.split())
    )
