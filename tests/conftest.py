"""Test-wide settings: one torch thread (tiny models; two threads fight on the 2-core CI machine),
and without a GPU, Triton kernels run in Triton's interpreter
(tests/unit/engine/kernels/test_fused_decode.py). The variable must be set before anything
imports Triton: torch's compiler may import it early.
Every test sees an idle machine (no busy-machine notes in outputs; tests of the note set the
load themselves). Also fixtures several modules share: `store` (training) and `chat_target_dir`
(capture)."""

import os
import signal

import pytest
import torch

torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch):
    """os.getloadavg reads 0: what the CLIs print does not depend on the machine's load."""
    if hasattr(os, "getloadavg"):
        monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))


@pytest.fixture(autouse=True)
def python_signal_handlers():
    """Python's own SIGINT handler (KeyboardInterrupt) and SIGTERM's default in each test, as an
    interactive run has them: pytest started as a shell's background job inherits SIGINT ignored,
    which the trainer rightly leaves ignored (`train.dist.StopRequest.install`)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    before_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGINT, before)
    signal.signal(signal.SIGTERM, before_term)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The capture store of the trainer's tiny target and samples (`tests.support.train_world`),
    for the train / resume / export modules that train from it."""
    from tests.support.train_world import make_world

    return make_world(tmp_path_factory.mktemp("train"))[2]


@pytest.fixture(scope="module")
def chat_target_dir(tmp_path_factory):
    """A saved tiny 4-layer Llama target with the tiny chat tokenizer (tests/support/tiny_tokenizer.py)."""
    from tests.support.tiny_models import save_tiny_model
    from tests.support.tiny_tokenizer import save_tiny_tokenizer

    path = save_tiny_model("llama", tmp_path_factory.mktemp("target") / "tiny", num_layers=4)
    save_tiny_tokenizer(path)
    return path
