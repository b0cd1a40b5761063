"""`specdraft serve --max-request-bytes`: its default (4 MiB) and a given value reach the server
(build_app); 0 is refused as a bad option value (exit 2)."""

from __future__ import annotations

from tests.support.engine_helpers import tiny_setup


def test_serve_passes_max_request_bytes_and_refuses_zero(monkeypatch):
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import specdraft.serve.server
    from specdraft.cli import app

    given = {}
    fake = SimpleNamespace(
        state=SimpleNamespace(
            server=SimpleNamespace(
                model_name="tiny", engine=SimpleNamespace(notes=[], draft=None), worker=None
            )
        )
    )
    monkeypatch.setattr(
        specdraft.serve.server, "build_app", lambda *a, **k: given.update(k) or fake
    )
    monkeypatch.setattr(specdraft.serve.server, "serve", lambda app_, host, port: None)
    target = str(tiny_setup("llama").target_dir)
    base = ["serve", "--target", target, "--no-spec", "--port", "8124"]
    assert CliRunner().invoke(app, base).exit_code == 0
    assert given["max_request_bytes"] == 4 * 2**20  # the default: 4 MiB
    assert CliRunner().invoke(app, [*base, "--max-request-bytes", "1000"]).exit_code == 0
    assert given["max_request_bytes"] == 1000
    refused = CliRunner().invoke(app, [*base, "--max-request-bytes", "0"])
    assert refused.exit_code == 2 and "--max-request-bytes" in refused.output
