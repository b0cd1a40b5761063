"""Messages a fresh user met that named internal config fields or gave wrong advice: regenerate
into its own input, --endpoint without --model, tune --min-speedup out of range, train --lr nan /
inf, convert --layout specdraft of a drafter without a manifest. Each names the option and a fix."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdraft.checkpoint import MANIFEST_FILE
from specdraft.regenerate.backends import served_model
from tests.support.cli import cli_args, flat, invoke, one_error, world  # noqa: F401
from tests.support.regenerate import CHATS, read_out, server  # noqa: F401


def test_regenerate_into_its_own_input_is_refused_first(tmp_path):
    data = tmp_path / "tt.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    before = data.read_text()
    result = invoke(
        cli_args(
            "regenerate",
            data,
            tmp_path / "." / "tt.jsonl",
            endpoint="http://127.0.0.1:9",
            no_chat=True,
        )
    )
    one_error(result, f"OUT is the input file DATA ({data}): give a new output path")
    assert "delete" not in result.output and data.read_text() == before


@pytest.fixture
def models_server():
    """GET /v1/models answers {"data": [{"id": name} for name in `served`]}."""
    served: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = json.dumps({"object": "list", "data": [{"id": m} for m in served]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    httpd.shutdown()
    httpd.server_close()


def test_served_model_is_the_one_listed(models_server):
    url, served = models_server
    served.append("tiny")
    assert served_model(url) == "tiny" and served_model(url + "/v1/") == "tiny"
    served.append("other")
    with pytest.raises(
        ValueError,
        match=r"^--endpoint needs --model, the served model's name \(.*/v1/models: "
        r"it serves tiny, other\)$",
    ):
        served_model(url)
    served.clear()
    with pytest.raises(ValueError, match=r"/v1/models: it lists none\)$"):
        served_model(url)


def test_regenerate_endpoint_without_model(server, tmp_path, monkeypatch):  # noqa: F811
    """A server that cannot list its models (the fake one has no GET): the error names --model, not
    RegenConfig.model; one that serves one model: it is used, and the command says so."""
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS[:2]))
    out = tmp_path / "out.jsonl"
    text = one_error(
        invoke(["regenerate", str(data), str(out), "--endpoint", server.url]),
        f"error: --endpoint needs --model, the served model's name (asking {server.url}/v1/models "
        "for it failed: HTTPStatusError)",
    )
    assert "RegenConfig" not in text and not out.exists()
    monkeypatch.setattr("specdraft.regenerate.backends.served_model", lambda url, key: "tiny")
    result = invoke(["regenerate", str(data), str(out), "--endpoint", server.url])
    assert result.exit_code == 0, result.output
    assert f"--model not given: using tiny, the one model {server.url} serves" in flat(
        result.output
    )
    assert [body["model"] for _, body in server.requests] == ["tiny"] * 3
    assert [r["messages"][-1]["content"] for r in read_out(out)] == ["re hello", "re two"]


@pytest.mark.parametrize("value", ["-3", "0", "nan"])
def test_tune_min_speedup_out_of_range_is_a_usage_error(world, value):  # noqa: F811
    draft, _, target = world
    result = invoke(cli_args("tune", target=target, draft=draft, min_speedup=value))
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert (
        "--min-speedup" in text and "must be a positive number" in text and "TuneConfig" not in text
    )


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_train_lr_not_finite(store, tmp_path, value):
    text = one_error(
        invoke(cli_args("train", store, tmp_path / "run", lr=value, steps=1)),
        f"error: --lr {value}: must be a finite positive number",
        code=2,
    )
    assert "Invalid learning rate" not in text and not (tmp_path / "run" / "checkpoints").exists()


def test_train_lr_nan_from_config(store, tmp_path):
    config = tmp_path / "train.json"
    config.write_text('{"lr": NaN}')
    one_error(
        invoke(cli_args("train", store, tmp_path / "run", config=config, steps=1)),
        "error: --lr nan: must be a finite positive number",
        code=2,
    )


@pytest.mark.parametrize("with_target", [False, True])
def test_convert_to_specdraft_without_manifest_names_the_layouts_that_work(
    world, tmp_path, with_target
):  # noqa: F811
    _, plain, target = world
    args = ["convert", str(plain), str(tmp_path / "out"), "--layout", "specdraft"]
    text = one_error(
        invoke(args + (["--target", str(target)] if with_target else [])),
        f"{plain}: no {MANIFEST_FILE}, which the specdraft layout carries and --target cannot supply; "
        "convert to --layout sglang or speculators instead",
    )
    assert text.endswith("(without a manifest the aux ids need it)") != with_target
    assert (
        invoke(
            cli_args("convert", plain, tmp_path / "out", layout="sglang", target=target)
        ).exit_code
        == 0
    )
