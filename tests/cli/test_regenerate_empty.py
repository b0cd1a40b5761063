"""regenerate leaves out a record whose answer came back empty, and counts it: the output is a
file capture reads without --skip-bad (it wrote the empty answer, and capture then refused that
line). The endpoint here answers some turns with whitespace, as a small target sometimes does."""

from __future__ import annotations

import json

import pytest

from specdraft.capture.store import CaptureStore
from tests.support.cli import cli_args, flat, invoke
from tests.support.regenerate import CHATS, FakeServer, last_user_turn, served


class EmptyAnswers(FakeServer):
    """FakeServer, but the chat turns after a word in `empty` get whitespace as the answer."""

    empty = ("two", "three")

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        status, reply = super().answer(path, body)
        word = last_user_turn(body)
        if status == 200 and word in self.empty:
            reply["choices"][0]["message"]["content"] = " \n"
        return status, reply


@pytest.fixture
def server():
    yield from served(EmptyAnswers())


def test_empty_answers_are_left_out_and_counted(server, tmp_path, chat_target_dir):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    out = tmp_path / "out.jsonl"
    result = invoke(cli_args("regenerate", data, out, endpoint=server.url, model="tiny"))
    assert result.exit_code == 0, result.output
    assert (
        f"{out}: 3 records written, 0 kept from an earlier run, 2 left out (the target's answer was empty)"
        in flat(result.output)
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == [
        0,
        3,
        4,
    ]  # chat 1 ("two") and chat 2 ("three") answered empty
    assert all(m["content"].strip() for r in rows for m in r["messages"])
    again = invoke(cli_args("regenerate", data, out, endpoint=server.url, model="tiny"))
    assert "0 records written, 3 kept from an earlier run, 2 left out" in flat(
        again.output
    )  # asked again
    assert out.read_text().count("\n") == 3
    capture = invoke(
        cli_args(
            "capture", chat_target_dir, out, tmp_path / "store", aux_layers="1,2,3", dtype="fp32"
        )
    )
    assert capture.exit_code == 0, capture.output
    assert len(CaptureStore(tmp_path / "store")) == 3
