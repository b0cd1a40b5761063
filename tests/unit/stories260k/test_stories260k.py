"""stories260K, the bundled default target: files, llama2.c readers, tokenizer, conversion.

References: expected_tokens.json (llama2.c's encoder and forward pass) and a llama2.c
encoder and forward pass re-written below in plain Python/torch, independently of the
converter (interleaved RoPE on the original, unpermuted weights).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from specdraft import stories260k
from specdraft.cli import app
from specdraft.stories260k import (
    CHECKPOINT_FILE,
    CONVERTED_FILES,
    EXPECTED_TOKENS_FILE,
    SAMPLE_FILE,
    SOURCE_SHA256,
    TOKENIZER_FILE,
    build_tokenizer,
    bundled_dir,
    convert_stories260k,
    read_llama2c_tokenizer,
    verify_sha256,
)
from specdraft.stories260k.llama2c import Llama2cHeader, read_llama2c_checkpoint
from specdraft.targets.config import end_token_ids
from tests.support.cli import cli_args

KNOWN_GOOD_START = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high."
)
# Mean NLL of the first 40 chunks of [BOS] + 255 sample tokens (the sample encoded as one
# text), measured here with this converter; the whole sample (393 chunks) gives 1.94, its
# later stories being harder (mojibake, "\n\n" paragraph breaks the model never saw).
NLL_FIRST_40_CHUNKS = 1.562
NUM_NLL_CHUNKS, CHUNK_LEN = 40, 256


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    return convert_stories260k(tmp_path_factory.mktemp("stories260k") / "hf")


@pytest.fixture(scope="module")
def model(converted):
    return AutoModelForCausalLM.from_pretrained(converted).eval()


@pytest.fixture(scope="module")
def tokenizer(converted):
    return AutoTokenizer.from_pretrained(converted)


@pytest.fixture(scope="module")
def checkpoint():
    return read_llama2c_checkpoint(bundled_dir() / CHECKPOINT_FILE)


@pytest.fixture(scope="module")
def pieces():
    return read_llama2c_tokenizer(bundled_dir() / TOKENIZER_FILE)


@pytest.fixture(scope="module")
def expected():
    return json.loads((bundled_dir() / EXPECTED_TOKENS_FILE).read_text())


@pytest.fixture(scope="module")
def sample() -> str:
    return (bundled_dir() / SAMPLE_FILE).read_text()


def llama2c_encode(text: str, pieces) -> list[int]:
    """llama2.c's `encode` (run.c) with BOS, merging the best-scoring pair, leftmost first."""
    lookup = {piece: token_id for token_id, (piece, _) in enumerate(pieces)}
    ids = [stories260k.BOS_ID] + ([lookup[b" "]] if text else [])
    for char in text:
        raw = char.encode()
        ids += [lookup[raw]] if raw in lookup else [stories260k.BYTE_OFFSET + byte for byte in raw]
    while True:
        best = None  # (score, position, merged id)
        for i in range(1, len(ids) - 1):
            merged = lookup.get(pieces[ids[i]][0] + pieces[ids[i + 1]][0])
            if merged is not None and (best is None or pieces[merged][1] > best[0]):
                best = (pieces[merged][1], i, merged)
        if best is None:
            return ids
        ids[best[1] : best[1] + 2] = [best[2]]


def llama2c_logits(
    header: Llama2cHeader, weights: dict[str, torch.Tensor], ids: list[int]
) -> torch.Tensor:
    """llama2.c's `forward` over a whole sequence: [T] ids -> [T, V] logits (float32)."""
    head_size, num_tokens = header.head_size, len(ids)
    angle = torch.arange(num_tokens)[:, None] / 10000.0 ** (
        torch.arange(0, head_size, 2) / head_size
    )
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]  # [T, 1, hd/2]

    def rope(t):  # [T, heads, hd]: rotate (even, odd) pairs
        real, imag = t[..., 0::2], t[..., 1::2]
        return torch.stack((real * cos - imag * sin, real * sin + imag * cos), -1).flatten(-2)

    def rmsnorm(x, gain):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain

    mask = torch.full((num_tokens, num_tokens), float("-inf")).triu(1)
    repeat = header.num_heads // header.num_kv_heads
    x = weights["token_embedding"][ids]
    for layer in range(header.num_layers):
        h = rmsnorm(x, weights["rms_att"][layer])
        q = rope((h @ weights["wq"][layer].T).view(num_tokens, header.num_heads, head_size))
        k = rope((h @ weights["wk"][layer].T).view(num_tokens, header.num_kv_heads, head_size))
        v = (h @ weights["wv"][layer].T).view(num_tokens, header.num_kv_heads, head_size)
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        attention = (torch.einsum("qhd,khd->hqk", q, k) / head_size**0.5 + mask).softmax(-1)
        x = (
            x
            + torch.einsum("hqk,khd->qhd", attention, v).reshape(num_tokens, -1)
            @ weights["wo"][layer].T
        )
        h = rmsnorm(x, weights["rms_ffn"][layer])
        x = (
            x
            + (F.silu(h @ weights["w1"][layer].T) * (h @ weights["w3"][layer].T))
            @ weights["w2"][layer].T
        )
    return rmsnorm(x, weights["rms_final"]) @ weights["token_embedding"].T


def test_bundled_files_are_the_known_good_copies():
    folder = bundled_dir()
    assert folder.is_dir() and folder.name == "stories260K"
    for name, digest in SOURCE_SHA256.items():
        assert verify_sha256(folder / name, digest) == digest
    assert "Copyright (c) 2023 Andrej Karpathy" in (folder / "LICENSE").read_text()
    assert "CDLA-Sharing-1.0" in (folder / "README.md").read_text()


def test_checkpoint_header_and_shapes(checkpoint):
    header, weights = checkpoint
    assert header == Llama2cHeader(64, 172, 5, 8, 4, 512, 512, shared_classifier=True)
    assert (header.head_size, header.kv_dim) == (8, 32)
    assert weights["wk"].shape == (5, 32, 64) and weights["w2"].shape == (5, 64, 172)
    assert sum(t.numel() for t in weights.values()) == 260_032
    assert all(t.dtype == torch.float32 for t in weights.values())


def test_converted_logits_match_llama2c_forward(model, checkpoint, sample, tokenizer):
    ids = tokenizer(sample[:2000])["input_ids"][:200]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    reference = llama2c_logits(*checkpoint, ids)
    assert torch.allclose(logits, reference, rtol=0, atol=2e-4), (logits - reference).abs().max()
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))


def test_greedy_from_bos_reproduces_known_good_text(model, tokenizer, expected):
    with torch.no_grad():
        output = model.generate(
            torch.tensor([[stories260k.BOS_ID]]),
            max_new_tokens=200,
            do_sample=False,
            pad_token_id=stories260k.EOS_ID,
        )[0]
    assert len(output) == 201
    assert output[:64].tolist() == expected["greedy_ids_from_bos_64"]
    assert tokenizer.decode(output, skip_special_tokens=True).startswith(KNOWN_GOOD_START)


def test_mean_nll_on_tinystories_sample(model, tokenizer, sample):
    ids = tokenizer(sample[:40_000], add_special_tokens=False)["input_ids"]
    body = CHUNK_LEN - 1
    chunks = torch.tensor(
        [[stories260k.BOS_ID] + ids[i * body : (i + 1) * body] for i in range(NUM_NLL_CHUNKS)]
    )
    with torch.no_grad():
        logits = model(chunks).logits[:, :-1]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunks[:, 1:].reshape(-1))
    assert nll.item() == pytest.approx(NLL_FIRST_40_CHUNKS, abs=0.02)


def test_tokenizer_reproduces_llama2c_encodings(tokenizer, expected, pieces, sample):
    for text, ids in expected["encodings"].items():
        assert tokenizer(text)["input_ids"] == ids, text
    assert tokenizer("")["input_ids"] == llama2c_encode("", pieces) == [stories260k.BOS_ID]
    for line in sample[:20_000].split("\n"):
        assert tokenizer(line)["input_ids"] == llama2c_encode(line, pieces), line


def test_tokenizer_round_trips_sample(tokenizer, sample):
    ids = tokenizer(sample)["input_ids"]
    assert ids[0] == stories260k.BOS_ID and stories260k.EOS_ID not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == sample
    for text in (" leading space", "two  spaces", "tab\tand ☀️ emoji", "\nstarts with newline"):
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_built_tokenizer_equals_saved_one(pieces, tokenizer, sample):
    built = build_tokenizer(pieces)
    assert built(sample[:5000])["input_ids"] == tokenizer(sample[:5000])["input_ids"]
    assert (built.bos_token_id, built.eos_token_id, built.unk_token_id) == (1, 2, 0)


def test_converted_config(converted):
    raw = json.loads((converted / "config.json").read_text())
    assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"] == 10000.0
    config = AutoConfig.from_pretrained(converted)
    assert (
        config.rope_parameters["rope_theta"] == 10000.0
        and config.rope_parameters["rope_type"] == "default"
    )
    assert (config.rms_norm_eps, config.max_position_embeddings, config.tie_word_embeddings) == (
        1e-5,
        512,
        True,
    )
    assert (config.bos_token_id, config.eos_token_id, config.head_dim) == (1, 2, 8)
    generation = json.loads((converted / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (
        1,
        [2, 1],
    )  # EOS, and BOS (run.c)
    assert (converted / "LICENSE").is_file()


def test_generation_ends_at_bos_where_a_story_ends(converted, tokenizer):
    """The model ends a story with BOS (it was trained on stories each opened by BOS), where
    llama2.c's run.c stops; before, `generate` ran on into a second story until the limit."""
    assert end_token_ids(tokenizer, converted) == [stories260k.BOS_ID, stories260k.EOS_ID]
    command = cli_args(
        "generate", target=converted, prompt="Once upon a time", max_new_tokens=400, threads=1
    )
    stopped, past = (CliRunner().invoke(app, command + flags) for flags in ([], ["--ignore-eos"]))
    assert stopped.exit_code == past.exit_code == 0, stopped.output + past.output
    story, table = stopped.output.split("<s>\n", 1)  # the text ends at the first BOS
    assert story.startswith("Once upon a time, there was a little girl named Lily.")
    assert past.output.startswith(story + "<s> Once upon a time")  # --ignore-eos: a second story
    counts = [int(run.output.split("output tokens")[1].split("│")[1]) for run in (stopped, past)]
    assert counts[0] < 400 and counts[1] == 400


def _copy_sources(folder: Path) -> Path:
    folder.mkdir()
    for name in (CHECKPOINT_FILE, TOKENIZER_FILE):
        shutil.copyfile(bundled_dir() / name, folder / name)
    return folder


def test_sha256_mismatch_names_the_file(tmp_path):
    source = _copy_sources(tmp_path / "src")
    data = bytearray((source / CHECKPOINT_FILE).read_bytes())
    data[5000] ^= 1  # same size and header, different weights: the circulating bad copy's kind
    (source / CHECKPOINT_FILE).write_bytes(bytes(data))
    expected = SOURCE_SHA256[CHECKPOINT_FILE]
    with pytest.raises(
        ValueError, match=rf"{CHECKPOINT_FILE}: sha256 [0-9a-f]{{64}}, expected {expected}"
    ):
        convert_stories260k(tmp_path / "out", source_dir=source)
    assert not (tmp_path / "out").exists()


def test_truncated_or_corrupt_checkpoint_raises(tmp_path):
    data = (bundled_dir() / CHECKPOINT_FILE).read_bytes()
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(data[:-4096])
    with pytest.raises(
        ValueError, match=r"truncated\.bin: 1,052,444 bytes, but its header .* implies 1,056,540"
    ):
        read_llama2c_checkpoint(truncated)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\xff" * 28 + data[28:])
    with pytest.raises(ValueError, match=r"garbage\.bin: implausible llama2.c header"):
        read_llama2c_checkpoint(garbage)
    tokenizer_file = tmp_path / "tok.bin"
    tokenizer_file.write_bytes((bundled_dir() / TOKENIZER_FILE).read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"tok\.bin: token 511 .*truncated"):
        read_llama2c_tokenizer(tokenizer_file)


def test_conversion_is_skipped_when_current_and_redone_when_stale(tmp_path):
    assert not stories260k.is_converted(tmp_path / "hf")
    out = convert_stories260k(tmp_path / "hf")
    weights = out / "model.safetensors"
    first = weights.stat().st_mtime_ns
    assert stories260k.is_converted(out)  # what the demo says "reused" for
    assert convert_stories260k(out) == out and weights.stat().st_mtime_ns == first
    weights.unlink()  # a record without its files is not a conversion
    assert not stories260k.is_converted(out)
    assert convert_stories260k(out) == out and weights.is_file()
    record = json.loads((out / stories260k.SOURCE_RECORD_FILE).read_text())
    record["converter"] = "an older converter"
    (out / stories260k.SOURCE_RECORD_FILE).write_text(json.dumps(record))
    assert not stories260k.is_converted(out)
    convert_stories260k(out)
    assert (
        json.loads((out / stories260k.SOURCE_RECORD_FILE).read_text())["converter"]
        != "an older converter"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging or old folders left


def test_conversion_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and not a stories260K conversion"):
        convert_stories260k(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_converted_files_get_the_umask_mode(tmp_path, umask):
    # save_pretrained writes model.safetensors owner-only (0600); the conversion must not keep that
    previous = os.umask(umask)
    try:
        out = convert_stories260k(tmp_path / "hf")
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(CONVERTED_FILES) <= set(modes)
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)
