"""specdraft.regenerate.backends: `regenerate --target` loads the target as capture does, so the
multimodal wrappers that capture / train / generate read work here too (issue #34 item 13:
AutoModelForCausalLM refused Qwen3-VL and Mistral3 with a multi-kilobyte error)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import tiny_chat_tokenizer


@pytest.mark.parametrize("arch", ["qwen3_vl", "mistral3"])
def test_regenerate_target_reads_multimodal_wrappers(arch, tmp_path):
    target = save_tiny_model(arch, tmp_path / "target", num_layers=2, vocab_size=96)
    tiny_chat_tokenizer().save_pretrained(target)
    data = tmp_path / "docs.txt"
    data.write_text("once upon a time there was a girl\n")
    out = tmp_path / "out.jsonl"
    args = ["regenerate", data, out, "--target", target, "--no-chat", "--prompt-tokens", "3"]
    result = CliRunner().invoke(
        app, [str(a) for a in [*args, "--max-new-tokens", "4"]], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 0, result.output
    assert "1 records written" in result.output, result.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["prompt"] == "once upon" and row["completion"].strip()
