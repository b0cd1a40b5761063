"""Numeric options are range-checked by click (a usage error, exit 2, before anything loads), the
export settings are never silently replaced, and the messages fit the command and engine given."""

from __future__ import annotations

import pytest

from specdraft.export import ExportError, export_draft, spec_for_export
from tests.support.cli import cli_args, flat, invoke
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(draft dir, its target dir, a directory with an empty config.json: passes --target's check)."""
    root = tmp_path_factory.mktemp("ranges")
    draft, target = draft_checkpoint(root)
    (root / "bare").mkdir()
    (root / "bare" / "config.json").write_text("{}")
    return draft, target, root / "bare"


def usage_error(args: list[str], option: str) -> str:
    result = invoke(args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    text = flat(result.output)
    assert f"Invalid value for '{option}'" in text, text
    return text


# ------------------------------------------------------------------------------ 1. ports


@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_serve_port_out_of_range_is_a_usage_error(world, port):
    _, _, bare = world
    text = usage_error(cli_args("serve", target=bare, no_spec=True, port=port), "--port")
    assert (
        "Input should be "
        + ("less than or equal to 65535" if port == "99999" else "greater than or equal to 1")
        in text
    )


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--url", "http://127.0.0.1:abc", "--wait", "0"],
        ["bench", "--url", "http://127.0.0.1:99999", "--wait", "0"],
        cli_args(
            "bench", url="http://127.0.0.1:8000", baseline_url="http://127.0.0.1:70000", wait=0
        ),
        cli_args("regenerate", "d.jsonl", "o.jsonl", endpoint="http://127.0.0.1:99999", model="m"),
    ],
)
def test_url_port_out_of_range_is_a_usage_error(args):
    option = next(
        a
        for a in args
        if a in ("--url", "--baseline-url", "--endpoint")
        and not args[args.index(a) + 1].endswith(":8000")
    )
    text = usage_error(args, option)
    assert "port" in text and "1..65535" in text


# ------------------------------------------------------------ 2. export's speculative settings


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--num-steps", "0"),
        ("--topk", "0"),
        ("--num-steps", "-2"),
        ("--topk", "-1"),
        ("--num-draft-tokens", "-1"),
    ],
)
def test_export_settings_out_of_range_are_usage_errors(world, tmp_path, flag, value):
    draft, target, _ = world
    text = usage_error(
        [
            "export",
            str(draft),
            str(tmp_path / "o"),
            "--engine",
            "sglang",
            "--target",
            str(target),
            flag,
            value,
        ],
        flag,
    )
    assert "Input should be greater than or equal to" in text and "SpecConfig" not in text
    assert not (tmp_path / "o").exists()


def test_export_library_refuses_zero_instead_of_defaulting():
    assert (
        spec_for_export("sglang", 3, 1, None).num_draft_tokens == 4
    )  # None: num_steps + 1 for a chain
    for steps, topk, tokens, name in (
        (0, 1, None, "num_steps"),
        (3, 0, None, "topk"),
        (3, 1, 0, "num_draft_tokens"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} 0: must be >= 1"):
            spec_for_export("sglang", steps, topk, tokens)


def test_export_help_shares_generate_and_serve_wording():
    from specdraft.cli.options import NUM_DRAFT_TOKENS_HELP

    help_text = flat(invoke(["export", "--help"]).output)
    assert flat(NUM_DRAFT_TOKENS_HELP) in help_text and "x>=1" in help_text


# ------------------------------------------------------------------- 3. vLLM's chain rule


def test_vllm_export_with_other_draft_tokens_names_vllm_chains_only(world, tmp_path):
    draft, target, _ = world
    for engine in ("vllm", "speculators"):
        with pytest.raises(ExportError) as info:
            spec_for_export(engine, 3, 1, 5)
        message = str(info.value)
        assert "vLLM runs chains only (num_speculative_tokens = num_steps)" in message, message
        assert (
            "num_steps 3 / num_draft_tokens 4" in message
            and "num_steps 4 / num_draft_tokens 5" in message
        )
        assert "SGLang" not in message and "tree" not in message and "topk" not in message
    result = invoke(
        cli_args("export", draft, tmp_path / "v", engine="vllm", target=target, num_draft_tokens=5)
    )
    assert (
        result.exit_code == 2
        and "vLLM runs chains only" in result.output
        and "SGLang" not in result.output
    )
    # SGLang's wording is unchanged (case S4)
    with pytest.raises(ExportError, match="SGLang would silently set num_draft_tokens = 4"):
        spec_for_export("sglang", 3, 1, 5)


# --------------------------------------------------------------- 4. the ids line per engine


@pytest.mark.parametrize(
    "engine, shown, hidden",
    [
        ("speculators", "top-level ids [2, 3, 4] (vLLM)", "eagle_config"),
        ("vllm", "top-level ids [2, 3, 4] (vLLM), eagle_config ids [1, 2, 3] (SGLang)", "None"),
        ("sglang", "top-level ids [2, 3, 4] (vLLM), eagle_config ids [1, 2, 3] (SGLang)", "None"),
    ],
)
def test_export_prints_only_the_ids_its_layout_has(world, tmp_path, engine, shown, hidden):
    draft, target, _ = world
    result = export_draft(draft, tmp_path / engine, engine=engine, target=target)
    line = next(note for note in result.notes if note.startswith("aux layers"))
    assert shown in line and hidden not in line, line


# ------------------------------------------------------------- 5. sampling before loading


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--top-p", "1.5"),
        ("--top-p", "0"),
        ("--top-p", "-0.1"),
        ("--sampling-top-k", "-1"),
        ("--temperature", "-1"),
    ],
)
def test_generate_sampling_out_of_range_is_the_only_output(world, flag, value):
    _, _, bare = world
    result = invoke(["generate", "--target", str(bare), "--prompt", "hi", flag, value])
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert f"Invalid value for '{flag}'" in text and not result.output.startswith("hi")
    assert "error: top_p" not in text


def test_regenerate_top_p_out_of_range_is_a_usage_error():
    text = usage_error(
        cli_args("regenerate", "d.jsonl", "o.jsonl", endpoint="http://h:1", model="m", top_p="1.5"),
        "--top-p",
    )
    assert "Sampling.top_p" not in text and "1.5: must be in (0, 1] (1 = off)" in text


# ------------------------------------------------------------ 6. a missing .pt for --draft


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve"], ["tune"]])
def test_missing_training_checkpoint_names_both_draft_forms(world, tmp_path, command):
    _, _, bare = world
    missing = tmp_path / "run" / "checkpoints" / "step-99999.pt"
    text = usage_error(command + ["--target", str(bare), "--draft", str(missing)], "--draft")
    assert (
        f"{missing}: no such file or directory; pass a drafter directory (config.json, model.safetensors) "
        "or a training checkpoint (RUN/checkpoints/step-N.pt)"
    ) in text


# ------------------------------------------------------------------ 7. one exit code for ranges


@pytest.mark.parametrize(
    "args, option",
    [
        (["bench", "--url", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency"),
        (["bench", "--url", "http://127.0.0.1:9", "--concurrency", "1,-4"], "--concurrency"),
        (["bench", "--url", "http://127.0.0.1:9", "--concurrency", ""], "--concurrency"),
        (["bench", "--url", "http://127.0.0.1:9", "--repeats", "0"], "--repeats"),
        (["bench", "--url", "http://127.0.0.1:9", "--max-tokens", "0"], "--max-tokens"),
        (["bench", "--url", "http://127.0.0.1:9", "--num-prompts", "0"], "--num-prompts"),
        (cli_args("serve", target="{bare}", no_spec=True, max_queue=-5), "--max-queue"),
        (cli_args("serve", target="{bare}", no_spec=True, threads=0), "--threads"),
        (cli_args("generate", target="{bare}", prompt="hi", threads=0), "--threads"),
        (cli_args("tune", topks="0,2", target="{bare}", draft="{bare}"), "--topks"),
    ],
)
def test_numeric_ranges_are_usage_errors(world, args, option):
    _, _, bare = world
    usage_error([a.replace("{bare}", str(bare)) for a in args], option)


# ------------------------------------------------------------------ 8. capture's options


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--max-length", "0"),
        ("--shard-tokens", "0"),
        ("--batch-tokens", "0"),
        ("--max-length", "-5"),
    ],
)
def test_capture_numbers_out_of_range_are_usage_errors(world, tmp_path, flag, value):
    _, _, bare = world
    text = usage_error(
        ["capture", str(bare), str(tmp_path / "d.jsonl"), str(tmp_path / "o"), flag, value], flag
    )
    assert "Input should be greater than or equal to 1" in text and "StoreSettings" not in text
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["capture", "train"])
@pytest.mark.parametrize("value", ["", " "])
def test_empty_aux_layers_is_a_usage_error(world, tmp_path, value, command):
    _, _, bare = world
    args = (
        [str(bare), str(tmp_path / "d.jsonl"), str(tmp_path / "o")]
        if command == "capture"
        else [str(tmp_path / "store"), str(tmp_path / "run")]
    )
    text = usage_error([command, *args, "--aux-layers", value], "--aux-layers")
    assert (
        f"{value!r} is empty; leave --aux-layers out for the default layers ([2, L//2, L-3] for an L-layer target), "
        "or give three layers, e.g. 2,16,29"
    ) in text


def test_capture_aux_layers_left_out_mean_the_default(world, tmp_path, monkeypatch):
    import specdraft.capture.stage

    _, target, _ = world  # a real config.json: capture refuses one without model_type (bare's {})
    seen = []

    def fake_capture(cfg, console=None):
        seen.append(cfg.aux_layers)
        raise ValueError("stop here")

    monkeypatch.setattr(specdraft.capture.stage, "capture_dataset", fake_capture)
    base = ["capture", str(target), str(tmp_path / "d.jsonl"), str(tmp_path / "o")]
    for extra in ([], ["--aux-layers", "1,2,3"]):
        result = invoke(base + extra)
        assert result.exit_code == 1 and "stop here" in result.output, result.output
    assert seen == [None, (1, 2, 3)]  # None: conventions.default_aux_layers of the target


@pytest.mark.parametrize(
    "args, option, example",
    [
        (
            cli_args("capture", "{bare}", "d.jsonl", "o", aux_layers="2,x,4"),
            "--aux-layers",
            "e.g. 2,16,29",
        ),
        (
            ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "1,x"],
            "--concurrency",
            "e.g. 1,4,16",
        ),
        (
            cli_args("tune", target="{bare}", draft="{bare}", topks="1,x"),
            "--topks",
            "e.g. 1,2,4",
        ),
        (
            cli_args("tune", target="{bare}", draft="{bare}", topks=0),
            "--topks",
            "e.g. 1,2,4",
        ),
    ],
)
def test_integer_list_errors_give_an_example_for_their_option(world, args, option, example):
    _, _, bare = world
    text = usage_error([a.replace("{bare}", str(bare)) for a in args], option)
    assert example in text and text.count("e.g.") == 1, text


# ---------------------------------------------------------- 9. bench: one server given twice


@pytest.mark.parametrize(
    "url, baseline",
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("http://LocalHost:8000", "http://localhost:8000/"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://gpu-box:443/", "https://GPU-BOX"),
        (
            "http://127.0.0.1:8000/v1",
            "http://127.0.0.1:8000",
        ),  # the OpenAI clients' form is the same server
        ("http://gpu-box:8000/v1/", "http://GPU-BOX:8000/"),
        ("http://localhost:8000/v1", "http://127.0.0.1:8000/v1//"),
    ],
)
def test_bench_refuses_one_server_as_both(url, baseline, tmp_path):
    result = invoke(cli_args("bench", url=url, baseline_url=baseline, wait=0, out=tmp_path / "o"))
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert (
        f"Invalid value for '--url' / '--baseline-url': {url} and {baseline} are the same server: measuring "
        "one server twice gives no speedup; give the server without speculation as --baseline-url, or leave "
        "--baseline-url out"
    ) in text, text
    assert not (tmp_path / "o").exists()


def test_distinct_servers_are_not_the_same_server():
    from specdraft.cli.benchmark import _same_server

    for a, b in (
        ("http://h:8000", "http://h:8001"),
        ("http://h:8000", "https://h:8000"),
        ("http://h:8000", "http://g:8000"),
        ("http://h:8000/a", "http://h:8000/b"),
        ("http://h:8000/v1", "http://h:8001"),
        ("http://h:8000/a/v1", "http://h:8000/b/v1"),
        ("http://v1:8000", "http://h:8000/v1"),
    ):
        assert not _same_server(a, b), (a, b)
