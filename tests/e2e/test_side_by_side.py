"""benchmarks/side_by_side.py's parts that need neither speculators nor a GPU: the train tokens/s
both trainers are measured by, the openai stand-in speculators' training path imports, and the GPU
mode's settings (the full-size drafter's, train_config_full.json)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    sys.path.insert(0, str(BENCHMARKS))  # its helpers, as when run as a script
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokens_per_s_leaves_out_warm_up_epoch_ends_and_the_last_step():
    workers = load("side_by_side_workers")
    # steps 0..5 end at these times; step 3 is the first of epoch 1 (its interval holds the
    # epoch's end: validation, checkpoint); step 5 is the last (the final checkpoint)
    ends = [0.0, 1.0, 3.0, 13.0, 14.0, 100.0]
    tokens = [10.0, 20.0, 40.0, 99.0, 30.0, 99.0]
    epochs = [0, 0, 0, 1, 1, 1]
    assert workers.tokens_per_s(ends, tokens, epochs, skip=1) == pytest.approx(90 / 4)
    assert workers.tokens_per_s(ends, tokens, epochs, skip=2) == pytest.approx(70 / 3)
    assert workers.tokens_per_s(ends, tokens, epochs, skip=0) == pytest.approx(90 / 4)
    with pytest.raises(ValueError, match="6 steps leave no interval after the first 5"):
        workers.tokens_per_s(ends, tokens, epochs, skip=5)


def test_openai_stub_imports_as_speculators_does_here_and_in_child_processes():
    """In a subprocess with openai hidden, so this interpreter's modules stay as they are; its own
    child (as speculators' data-loader workers are) imports the stub too."""
    code = f"""
import importlib.util, subprocess, sys
find = importlib.util.find_spec  # as if openai were not installed
importlib.util.find_spec = lambda name, *a: None if name == "openai" else find(name, *a)
sys.path.insert(0, {str(BENCHMARKS)!r})
import side_by_side_workers as w
w.stub_openai()
import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.completion import Completion
assert isinstance(Completion | ChatCompletion, object) and openai.Client and openai.AsyncClient
try:
    openai.OpenAI(base_url="http://127.0.0.1:1", api_key="EMPTY")
except RuntimeError as e:
    print("refused:", e)
child = "import openai.types.chat, openai; print('child:', openai.__file__)"
subprocess.run([sys.executable, "-c", child], check=True)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "refused: openai is not installed" in done.stdout
    stub = str(BENCHMARKS / "openai_stub" / "openai" / "__init__.py")
    assert f"child: {stub}" in done.stdout


def test_gpu_mode_takes_the_full_size_drafters_settings(monkeypatch, tmp_path):
    side = load("side_by_side")
    full = json.loads((side.ASSETS / "train_config_full.json").read_text())
    argv = ["side_by_side.py", "--device", "cuda", "--work", str(tmp_path), "--stages", "score"]
    monkeypatch.setattr(sys, "argv", argv)
    args = side.parse_args()
    assert (args.steps, args.new_tokens, args.skip_steps, args.stages) == (2000, 192, 10, {"score"})
    assert (args.lr, args.batch_size, args.ttt_steps, args.draft_vocab_size) == (
        full["lr"],
        full["batch_size"],
        full["ttt_steps"],
        full["draft_vocab_size"],
    )
    assert args.tokens_per_step is None  # batch x the store's mean sample length
    monkeypatch.setattr(sys, "argv", [*argv, "--stages", "data,train"])
    with pytest.raises(SystemExit):
        side.parse_args()
