"""A truncated safetensors file (a download or copy cut short): the target's model.safetensors in
generate, serve, capture, regenerate --target and doctor --target, the drafter's in inspect,
generate, export, convert, serve and doctor, a capture shard in train, store convert and doctor
--samples. Each is one `error:` line naming the file and the fix (it was safetensors' traceback,
"incomplete metadata"), exit 2 in every command: unusable input the user must fix, as doctor
says of its other inputs it cannot judge (an unreadable config or --samples file). Re-running
capture, as the shard's message says, redoes the shard."""

from __future__ import annotations

import shutil
import socket

import pytest

from tests.support.cli import cli_args, flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.tiny_tokenizer import save_tiny_tokenizer

TARGET_FIX = "re-download the target's weights from where the model came from"
SHARD = "shard-00000.safetensors"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, target dir with tokenizer, data.jsonl, the capture command of a 2-shard store)."""
    root = tmp_path_factory.mktemp("damaged")
    draft, target = draft_checkpoint(root)
    save_tiny_tokenizer(target)
    data = root / "data.jsonl"
    data.write_text(
        "".join(
            f'{{"text": "story {i}: the cat sat on the mat and looked at the dog"}}\n'
            for i in range(8)
        )
    )
    capture = cli_args(
        "capture",
        target,
        data,
        root / "store",
        no_chat=True,
        aux_layers="2,3,4",
        dtype="fp32",
        shard_tokens=64,
    )
    assert invoke(capture).exit_code == 0
    return draft, target, capture


def one_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    text = flat(result.output)
    assert text.startswith("error: ") and text.count("error: ") == 1, result.output
    assert all(f in text for f in fragments), text


def truncate(path, keep: float = 0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def cut_copy(directory, to, file: str = "model.safetensors", keep: float = 0.5):
    """(the copy of `directory` at `to` whose `file` is cut to `keep` of its bytes, the message
    fragment that names that file as damaged)."""
    shutil.copytree(directory, to)
    truncate(to / file, keep)
    return to, f"{to / file}: cannot be read as safetensors, cut short or damaged ("


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def target_commands(draft, target, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world"}\n')
    return {
        "generate": cli_args(
            "generate", target=target, draft=draft, prompt="hello", max_new_tokens=2
        ),
        "serve": cli_args("serve", target=target, draft=draft, port=free_port()),
        "capture": ["capture", str(target), str(data), str(tmp_path / "store"), "--no-chat"],
        "regenerate": cli_args(
            "regenerate", data, tmp_path / "out.jsonl", target=target, no_chat=True
        ),
        "doctor": ["doctor", str(draft), "--target", str(target)],
    }


@pytest.mark.parametrize("keep", [0.5, 0.001], ids=["in-the-data", "in-the-header"])
@pytest.mark.parametrize("command", ["generate", "serve", "capture", "regenerate", "doctor"])
def test_truncated_target_weights(world, tmp_path, command, keep):
    draft, target, _ = world
    bad, damaged = cut_copy(target, tmp_path / "target", keep=keep)
    one_error(invoke(target_commands(draft, bad, tmp_path)[command]), damaged, TARGET_FIX)


def drafter_commands(draft, target, tmp_path):
    return {
        "inspect": ["inspect", str(draft)],
        "generate": cli_args(
            "generate", target=target, draft=draft, prompt="hello", max_new_tokens=2
        ),
        "export": ["export", str(draft), str(tmp_path / "out"), "--engine", "sglang"],
        "convert": ["convert", str(draft), str(tmp_path / "out"), "--layout", "sglang"],
        "serve": cli_args("serve", target=target, draft=draft, port=free_port()),
        "doctor": ["doctor", str(draft)],
    }


@pytest.mark.parametrize("keep", [0.5, 0.001], ids=["in-the-data", "in-the-header"])
@pytest.mark.parametrize("command", ["inspect", "generate", "export", "convert", "serve", "doctor"])
def test_truncated_drafter_weights(world, tmp_path, command, keep):
    """The same exit as doctor's in every command (it was 1 outside doctor), through the one mapping
    of `cli.common.user_errors`; nothing is written."""
    draft, target, _ = world
    bad, damaged = cut_copy(draft, tmp_path / "draft", keep=keep)
    one_error(
        invoke(drafter_commands(bad, target, tmp_path)[command]),
        damaged,
        "restore the file from where the drafter came from, or re-export it",
    )
    assert not (tmp_path / "out").exists()


def shard_commands(draft, store, tmp_path):
    return {
        "train": cli_args(
            "train",
            store,
            tmp_path / "run",
            steps=1,
            batch_size=2,
            ttt_steps=1,
            draft_vocab_size=32,
        ),
        "store convert": cli_args("store", "convert", store, tmp_path / "peer", to="speculators"),
        "doctor": ["doctor", str(draft), "--samples", str(store)],
    }


@pytest.mark.parametrize("command", ["train", "store convert", "doctor"])
def test_truncated_capture_shard(world, tmp_path, command):
    draft, _, capture = world
    store, damaged = cut_copy(capture[3], tmp_path / "store", SHARD)
    one_error(
        invoke(shard_commands(draft, store, tmp_path)[command]),
        damaged,
        f"re-run `specdraft capture` with the same arguments into {store}",
    )


def test_rerunning_capture_redoes_a_truncated_shard(world, tmp_path):
    draft, _, capture = world
    store = tmp_path / "store"
    shutil.copytree(capture[3], store)
    whole = (store / SHARD).read_bytes()
    truncate(store / SHARD)
    result = invoke([*capture[:3], str(store), *capture[4:]])
    assert result.exit_code == 0, result.output
    assert (store / SHARD).read_bytes() == whole
    assert invoke(shard_commands(draft, store, tmp_path)["train"]).exit_code == 0
