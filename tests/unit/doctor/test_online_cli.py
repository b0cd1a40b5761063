"""`specdraft doctor --server`: the URL checked as bench checks it, and --samples required."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.client import check_url
from specdraft.doctor import run_doctor
from tests.support.cli import cli_args


def test_doctor_server_without_samples_is_one_line_naming_the_fix(tmp_path):
    result = CliRunner().invoke(app, ["doctor", str(tmp_path), "--server", "http://127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()) == (
        "error: --server http://127.0.0.1:1 needs --samples: pass --samples FILE with the target's own outputs "
        "(a capture store or JSONL, e.g. the demo's store-heldout) for the online acceptance check"
    )
    help_text = " ".join(CliRunner().invoke(app, ["doctor", "--help"]).output.split())
    assert "needs --samples" in help_text.replace("│ ", "").replace(" │", "")


def test_doctor_server_without_scheme_is_refused_as_bench_refuses_it(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"text": "hi"}\n')
    with pytest.raises(ValueError) as bench_error:
        check_url("localhost:8011", "--server")
    for extra in ([], ["--samples", str(tmp_path / "samples.jsonl")]):
        result = CliRunner().invoke(
            app, ["doctor", str(tmp_path), "--server", "localhost:8011", *extra]
        )
        assert result.exit_code == 2, result.output
        assert " ".join(result.output.split()) == f"error: {bench_error.value}"
        assert (
            "must start with http:// or https://" in result.output
            and "does not answer" not in result.output
        )
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        run_doctor(tmp_path, server="localhost:8011", samples=tmp_path / "samples.jsonl")


def test_url_scheme_in_any_case_passes_and_another_scheme_gets_a_fitting_example():
    assert check_url("HTTP://localhost:8011") == "HTTP://localhost:8011"
    with pytest.raises(
        ValueError,
        match=r"'ftp://h:80': must start with http:// or https:// \(e\.g\. http://h:80\)$",
    ):
        check_url("ftp://h:80", "--url")


def test_doctor_server_with_a_trailing_slash_or_v1_is_the_server(tmp_path):
    """--server http://host:port/v1/ checks the server at http://host:port (not requests to
    //metrics, which failed with "start the server at ...", nor to /v1/v1/models)."""
    import json

    from specdraft.engine.spec_config import SpecConfig
    from specdraft.serve.server import build_app, serve_in_thread
    from tests.support.doctor_helpers import served_world
    from tests.support.serve_helpers import word_tokenizer

    draft, target, samples = served_world(tmp_path, word_tokenizer())
    server = serve_in_thread(
        build_app(str(target), str(draft), SpecConfig.chain(3), max_seq_len=128)
    )
    try:
        result = CliRunner().invoke(
            app,
            cli_args(
                "doctor",
                draft,
                target=target,
                samples=samples,
                server=server.url + "/v1/",
                max_samples=8,
                json=True,
            ),
        )
    finally:
        server.stop()
    data = json.loads(result.output[result.output.index("{") :])
    online = next(f for f in data["findings"] if f["check"] == "online_acceptance")
    assert online["verdict"] == "pass", online
    assert f"to {server.url} (specdraft)" in online["evidence"]


def test_a_server_url_ending_in_v1_is_the_base_url(tmp_path):
    """doctor --server URL/v1 (the OpenAI clients' form) is the server at URL, as bench and
    regenerate take it: no longer refused, checked on to the next rule (--samples)."""
    assert check_url("http://127.0.0.1:8011/v1/", "--server") == "http://127.0.0.1:8011"
    result = CliRunner().invoke(
        app, ["doctor", str(tmp_path), "--server", "http://127.0.0.1:8011/v1/"]
    )
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()).startswith(
        "error: --server http://127.0.0.1:8011/v1/ needs --samples: pass --samples FILE"
    )
