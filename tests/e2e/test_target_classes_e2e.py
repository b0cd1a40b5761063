"""Every decoder class end to end through the CLI (issue #22), on tiny seeded targets with the
tiny chat tokenizer: capture (warning first when no engine serves the layers) -> train 20 steps
-> generate with the drafter equals --no-spec at T = 0 (the transformers-backed path, named)
-> doctor on the store passes (fails only its deployment checks, naming the engines' reason, on a
class no engine serves) -> export per engine, written or refused with the engine's reason."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from tests.support.tiny_models import MORE_ARCHITECTURES, save_tiny_model
from tests.support.tiny_tokenizer import CHAT, tiny_chat_tokenizer

NUM_LAYERS = 8
# class -> (engine -> the phrase of its refusal, or None: written)
EXPORTS = {
    "qwen3_moe": {"sglang": None, "vllm": None},
    "gpt_oss": {"sglang": None, "vllm": None},
    "gemma2": {"sglang": "gemma2.py does not implement", "vllm": "no EAGLE-3 drafter on Gemma 2"},
    "gemma3": {"sglang": "not the residual stream", "vllm": "no EAGLE-3 drafter on Gemma 3"},
    "llama4": {"sglang": None, "vllm": None},
    "phi3": {"sglang": None, "vllm": None},
    "qwen2_vl": {
        "sglang": "qwen2_vl.py does not implement",
        "vllm": "no EAGLE-3 drafter on Qwen2-VL",
    },
    "qwen3_vl": {"sglang": None, "vllm": None},
    "qwen3_vl_moe": {"sglang": None, "vllm": None},
    "mistral3": {"sglang": "llava.py does not implement", "vllm": None},
    "kimi_k25": {"sglang": None, "vllm": None},
    "llama4_mm": {"sglang": None, "vllm": None},
}
UNSERVED = {"gemma2", "gemma3", "qwen2_vl"}


def run(*args):
    return CliRunner().invoke(
        app, [str(a) for a in args], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"}
    )


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text(
        "".join(json.dumps({"messages": c}) + "\n" for c in [CHAT, CHAT[:3], CHAT[:5]] * 2)
    )
    return path


@pytest.mark.parametrize("arch", MORE_ARCHITECTURES)
def test_capture_train_generate_doctor_export(arch, chats, tmp_path):
    target = save_tiny_model(arch, tmp_path / "target", num_layers=NUM_LAYERS, vocab_size=96)
    tiny_chat_tokenizer().save_pretrained(target)
    captured = run("capture", target, chats, tmp_path / "store", "--aux-layers", "2,4,5")
    assert captured.exit_code == 0, captured.output
    first, second = captured.output.splitlines()[
        :2
    ]  # both before the work: the layers, then any warning
    assert first.startswith("aux layers [2, 4, 5] (specdraft indices, given"), first
    assert second.startswith("warning: no engine serves") == (arch in UNSERVED), second
    trained = run(
        "train", tmp_path / "store", tmp_path / "run", "--steps", "20", "--batch-size", "2"
    )
    assert trained.exit_code == 0, trained.output
    assert ("warning: no engine serves" in trained.output) == (arch in UNSERVED)
    draft = tmp_path / "run" / "draft"
    outputs = {}
    for name, extra in (("spec", ["--draft", draft]), ("plain", ["--no-spec"])):
        result = run(
            "generate",
            "--target",
            target,
            "--prompt",
            "hello , how are you ?",
            "--max-new-tokens",
            "12",
            "--ignore-eos",
            *extra,
        )
        assert result.exit_code == 0, result.output
        assert "note: target runs on the transformers" in result.output
        outputs[name] = result.output.split("?", 1)[1].split("\n")[0]
    assert outputs["spec"] == outputs["plain"] and outputs["spec"].strip()
    doctor = run(
        "doctor", draft, "--target", target, "--samples", tmp_path / "store", "--engine", "vllm"
    )
    if (
        arch in UNSERVED
    ):  # the deployment checks fail, naming the engines' reason; nothing else does
        assert doctor.exit_code == 1 and "serves no EAGLE-3 drafter" in doctor.output, doctor.output
        assert "3 fail" in doctor.output, doctor.output
    else:
        assert doctor.exit_code == 0, doctor.output
    for engine, refusal in EXPORTS[arch].items():
        result = run("export", draft, tmp_path / engine, "--engine", engine, "--target", target)
        if refusal is None:
            assert result.exit_code == 0 and (tmp_path / engine / "config.json").is_file(), (
                result.output
            )
        else:
            assert result.exit_code == 1 and refusal in result.output, result.output
            assert not (tmp_path / engine).exists()


@pytest.mark.parametrize("arch", ["kimi_k25", "gpt_oss"])
def test_serve_and_doctors_online_check_on_the_transformers_path(arch, chats, tmp_path):
    """specdraft's server over a transformers-backed target, and doctor --server against it."""
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.serve.server import build_app, serve_in_thread

    target = save_tiny_model(arch, tmp_path / "target", num_layers=NUM_LAYERS, vocab_size=96)
    tiny_chat_tokenizer().save_pretrained(target)
    assert run("capture", target, chats, tmp_path / "store", "--aux-layers", "2,4,5").exit_code == 0
    assert (
        run(
            "train", tmp_path / "store", tmp_path / "run", "--steps", "20", "--batch-size", "2"
        ).exit_code
        == 0
    )
    draft = tmp_path / "run" / "draft"
    server = serve_in_thread(
        build_app(str(target), str(draft), SpecConfig.chain(3), max_seq_len=128)
    )
    try:
        result = run(
            "doctor",
            draft,
            "--target",
            target,
            "--samples",
            tmp_path / "store",
            "--engine",
            "vllm",
            "--server",
            server.url,
            "--max-samples",
            "4",
            "--json",
        )
    finally:
        server.stop()
    data = json.loads(result.output[result.output.index("{") :])
    online = next(f for f in data["findings"] if f["check"] == "online_acceptance")
    assert online["verdict"] == "pass", online
