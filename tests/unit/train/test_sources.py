"""`specdraft train --online`: the target runs in the loop on a data file (no capture store)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.data.render import data_hash, load_dataset, tokenizer_fingerprint
from specdraft.train.sources import OnlineData, OnlineSource
from tests.support.cli import cli_args, cli_options, train_online
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import WORDS, save_tiny_tokenizer, tiny_chat_tokenizer


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = save_tiny_model("llama", tmp_path_factory.mktemp("online") / "target", num_layers=4)
    return save_tiny_tokenizer(path)


@pytest.fixture(scope="module")
def chats_file(tmp_path_factory):
    """16 chats of random words (seeded), one user and one assistant turn each."""
    rng = random.Random(0)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    chats = [
        [{"role": "user", "content": words(4)}, {"role": "assistant", "content": words(12)}]
        for _ in range(16)
    ]
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    return path


def test_cli_trains_online_and_records_the_data_in_the_manifest(target_dir, chats_file, tmp_path):
    run = tmp_path / "run"
    thinking = dict(aux_layers="1,2,3", template_kwargs='{"enable_thinking": true}')
    sizes = dict(steps=3, batch_size=4, grad_accum_steps=2, ttt_steps=2, draft_vocab_size=64)
    result = train_online(chats_file, tmp_path, target_dir, **thinking, **sizes)
    assert result.exit_code == 0, result.output
    assert "3 steps" in result.output
    manifest = json.loads((run / "draft" / "specdraft_manifest.json").read_text())
    tokenizer = tiny_chat_tokenizer()
    samples = load_dataset(chats_file, tokenizer, template_kwargs={"enable_thinking": True}).samples
    assert manifest["data_hash"] == data_hash(samples)
    assert manifest["aux_layers"] == [1, 2, 3] and manifest["draft"]["aux_layers"] == [1, 2, 3]
    assert manifest["tokenizer"] == tokenizer_fingerprint(tokenizer)
    assert manifest["chat_template"]["kwargs"] == {"enable_thinking": True}
    assert manifest["target"]["name_or_path"] == str(target_dir.resolve())
    assert manifest["training"]["config"]["grad_accum_steps"] == 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3]
    assert all(r["total"][0] > 0 for r in records)


def test_cli_online_bad_data_file_is_a_one_line_error_naming_it(target_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
    )  # no answer
    result = CliRunner().invoke(
        app,
        cli_args("train", bad, tmp_path / "run", online=True, target=target_dir, steps=1),
    )
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and str(bad) in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "run").exists()


def test_cli_online_aux_layers_of_another_count_name_the_engines_rule(
    target_dir, chats_file, tmp_path
):
    """Not "vllm hard-codes": both engines read 3 aux states, so such a drafter serves on neither."""
    result = train_online(chats_file, tmp_path, target_dir, aux_layers="1,3", steps=1)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert " ".join(result.output.split()) == (
        "error: --aux-layers 1,3: SGLang and vLLM both read exactly 3 aux states (fc input = 3 x target hidden "
        "size): a drafter trained on 2 serves on neither; got 2 aux layers: [1, 3]; give 3 increasing layers "
        "in 0..4, e.g. 1,2,3"
    )
    assert not (tmp_path / "run").exists()


def test_cli_online_options_need_their_mode(target_dir, chats_file, tmp_path):
    no_target = CliRunner().invoke(app, ["train", str(chats_file), str(tmp_path / "a"), "--online"])
    assert (
        no_target.exit_code == 2 and "--online needs --target" in no_target.output
    )  # usage errors
    no_online = CliRunner().invoke(app, ["train", str(tmp_path), str(tmp_path / "b"), "--no-chat"])
    assert no_online.exit_code == 2 and "apply with --online only" in no_online.output


TRAIN_ARGS = cli_options(
    aux_layers="1,2,3", steps=2, batch_size=4, ttt_steps=2, draft_vocab_size=64
)


def train_losses(run) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


def test_cli_online_target_dtype_runs_the_target_in_it(target_dir, chats_file, tmp_path):
    """--target-dtype bfloat16 runs the target in bf16 (other losses than fp32, still finite);
    float32, the default, gives exactly the losses of a run without the flag."""
    losses = {}
    for name, extra in (
        ("default", []),
        ("float32", ["--target-dtype", "float32"]),
        ("bf16", ["--target-dtype", "bfloat16"]),
    ):
        result = CliRunner().invoke(
            app,
            [
                "train",
                str(chats_file),
                str(tmp_path / name),
                "--online",
                "--target",
                str(target_dir),
                *TRAIN_ARGS,
                *extra,
            ],
        )
        assert result.exit_code == 0, result.output
        losses[name] = train_losses(tmp_path / name)
    assert losses["default"] == losses["float32"]
    assert all(math.isfinite(x) for x in losses["bf16"]) and losses["bf16"] != losses["float32"]
    data = OnlineData.load(
        OnlineSource(str(target_dir), str(chats_file), target_dtype="bf16"), (1, 2, 3)
    )
    assert data.target.embed_tokens.weight.dtype == torch.bfloat16
    batch = data.batch([0, 1], 64, torch.device("cpu"))
    assert batch.aux_hidden.dtype == batch.target_logits.dtype == torch.float32


def test_cli_online_skip_bad_skips_and_counts_bad_records(target_dir, chats_file, tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        chats_file.read_text()
        + json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        + "\n"
    )
    args = ["train", str(mixed), "--online", "--target", str(target_dir), *TRAIN_ARGS]
    refused = CliRunner().invoke(app, args[:2] + [str(tmp_path / "a")] + args[2:])
    assert refused.exit_code == 1
    assert (
        f"{mixed}:17" in refused.output
        and "(or pass --skip-bad to skip and count bad records)" in refused.output
    )
    skipped = CliRunner().invoke(app, args[:2] + [str(tmp_path / "b")] + args[2:] + ["--skip-bad"])
    assert skipped.exit_code == 0, skipped.output
    assert f"note: skipped 1 bad record in {mixed}" in " ".join(skipped.output.split())
    manifest = json.loads((tmp_path / "b" / "draft" / "specdraft_manifest.json").read_text())
    assert manifest["data_hash"] == data_hash(
        load_dataset(chats_file, tiny_chat_tokenizer()).samples
    )


def test_cli_online_only_options_are_refused_offline_and_checked(target_dir, chats_file, tmp_path):
    for extra in (["--target-dtype", "bfloat16"], ["--skip-bad"]):
        offline = CliRunner().invoke(app, ["train", str(tmp_path), str(tmp_path / "run"), *extra])
        assert (
            offline.exit_code == 2
            and "--target-dtype and --skip-bad apply with --online only" in offline.output
        )
    bad = train_online(chats_file, tmp_path, target_dir, target_dtype="int8")
    assert bad.exit_code == 2 and "Invalid value for '--target-dtype'" in bad.output
    assert (
        "'int8' is not one of 'bf16', 'fp16', 'fp32', 'bfloat16', 'float16', 'float32'"
        in bad.output
    )
    assert not (tmp_path / "run").exists()


def test_online_trains_a_base_tokenizer_with_a_template_file(target_dir, chats_file, tmp_path):
    """--tokenizer DIR (no chat template: a base model's) and --chat-template FILE: the chats
    render through the file, and the manifest records its hash, as for a tokenizer's own."""
    from specdraft.data.template import template_fingerprint
    from tests.support.tiny_tokenizer import TEMPLATE

    base = tmp_path / "base_tokenizer"
    tiny_chat_tokenizer(template=None).save_pretrained(base)  # a base model
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    args = ["train", str(chats_file), "--online", "--target", str(target_dir), *TRAIN_ARGS]
    refused = CliRunner().invoke(
        app, [*args[:2], str(tmp_path / "a"), *args[2:], "--tokenizer", str(base)]
    )
    assert refused.exit_code == 1 and "give one with --chat-template FILE" in refused.output
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            *args[:2],
            str(run),
            *args[2:],
            "--tokenizer",
            str(base),
            "--chat-template",
            str(template),
        ],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((run / "draft" / "specdraft_manifest.json").read_text())
    assert manifest["chat_template"]["hash"] == template_fingerprint(TEMPLATE)
    assert manifest["data_hash"] == data_hash(
        load_dataset(chats_file, tiny_chat_tokenizer()).samples
    )


def test_offline_chat_template_must_be_the_store_s(store, tmp_path):
    """Offline, a store was rendered at capture: --chat-template names the file it was rendered
    with; another file is refused naming both hashes, as is one for a store recording none."""
    import shutil

    from specdraft.data.template import template_fingerprint
    from tests.support.tiny_tokenizer import TEMPLATE

    other = tmp_path / "other.jinja"
    other.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    train = ["train", str(tmp_path / "copy"), str(tmp_path / "run"), "--chat-template", str(other)]
    none = CliRunner().invoke(app, [*train[:1], str(store), *train[2:]])
    assert none.exit_code == 2 and "records no chat template" in none.output, none.output
    shutil.copytree(store, tmp_path / "copy")
    index = json.loads((tmp_path / "copy" / "index.json").read_text())
    index["chat_template"] = {"hash": template_fingerprint(TEMPLATE), "kwargs": {}, "chat": True}
    (tmp_path / "copy" / "index.json").write_text(json.dumps(index))
    result = CliRunner().invoke(app, train)
    assert result.exit_code == 2, result.output
    assert (
        f"(hash {template_fingerprint(other.read_text())[:12]}): {tmp_path / 'copy'} was rendered "
        f"with chat template hash {template_fingerprint(TEMPLATE)[:12]}; capture with this"
    ) in result.output.replace("\n", "")
    tokenizer = CliRunner().invoke(
        app, ["train", str(store), str(tmp_path / "run"), "--tokenizer", str(tmp_path)]
    )
    assert tokenizer.exit_code == 2 and "--tokenizer and --reasoning apply with --online" in (
        tokenizer.output
    )
