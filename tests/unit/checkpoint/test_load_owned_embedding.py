"""An owned embed_tokens.weight at the target's width (speculators' trainer saves one; a drafter
that trains its embedding) loads as the drafter's own (refused before: "1 tensors match no
parameter"), is recorded as owned, is what specdraft's engine runs, survives every layout
bit-exactly; doctor fails it for SGLang, which replaces it, and passes it for vLLM, which keeps
a distinct owned one; export always writes target_hidden_size and draft_vocab_size (issue #21
item 2, "an owned embed_tokens.weight")."""

from __future__ import annotations

import json

import pytest
import torch

from specdraft.checkpoint import convert_draft, load_draft, tensor_digest
from specdraft.conventions.engines import (
    EMBEDDING_SOURCES,
    sglang_replaces_embedding,
    sglang_replaces_head,
)
from specdraft.doctor import run_doctor
from specdraft.engine.load import load_engine
from specdraft.export import ExportError, export_draft
from tests.support.doctor_helpers import draft_checkpoint, edit_config, edit_weights, one_thread  # noqa: F401

OWN = "embed_tokens.weight"


@pytest.fixture(scope="module")
def owned(tmp_path_factory):
    """(drafter without manifest whose file holds its own embedding at the target's width, target, that embedding)."""
    draft, target = draft_checkpoint(tmp_path_factory.mktemp("own"), layout="sglang")
    embedding = torch.randn(128, 32, generator=torch.Generator().manual_seed(3))
    edit_weights(draft, lambda t: t.update({OWN: embedding}))
    return draft, target, embedding


def test_the_engines_rules_are_recorded():
    assert (
        "_maybe_share_embeddings" in EMBEDDING_SOURCES["vllm"]
        and "set_embed" in EMBEDDING_SOURCES["sglang"]
    )
    assert sglang_replaces_embedding({"hidden_size": 32, "target_hidden_size": 32})
    assert sglang_replaces_embedding({"hidden_size": 32})
    assert not sglang_replaces_embedding({"hidden_size": 32, "target_hidden_size": 64})
    assert sglang_replaces_head({}) and not sglang_replaces_head({"draft_vocab_size": 64})


def test_an_owned_embedding_loads_as_the_drafters_own(owned):
    draft, _, embedding = owned
    model = load_draft(draft, target_num_layers=5).model
    assert model.cfg.owns_embedding and model.cfg.embedding_owned and model.embedding_loaded
    assert torch.equal(model.embed_tokens.weight, embedding)


def test_the_engine_runs_the_owned_embedding(owned):
    draft, target, embedding = owned
    from specdraft.engine.spec_config import SpecConfig

    engine = load_engine(target, draft, SpecConfig(2, 1, 3))
    assert torch.equal(engine.draft.embed_tokens.weight, embedding)
    assert not torch.equal(engine.draft.embed_tokens.weight, engine.target.tok_embeddings.weight)


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_an_owned_embedding_round_trips_every_layout(owned, tmp_path, layout):
    draft, _, embedding = owned
    assert convert_draft(draft, tmp_path / "out", layout=layout, target_num_layers=5).num_copied > 0
    back = load_draft(tmp_path / "out", target_num_layers=5).model
    assert back.cfg.embedding_owned and tensor_digest(back.embed_tokens.weight) == tensor_digest(
        embedding
    )


def test_doctor_fails_it_for_sglang_and_passes_it_for_vllm(owned):
    draft, target, _ = owned
    vllm = run_doctor(draft, target=target, engine="vllm")
    assert vllm.finding("keys_match_engine").verdict == "pass"
    assert vllm.finding("embedding_and_head_as_trained").verdict == "pass"
    assert (
        "vLLM runs it with its own embedding"
        in vllm.finding("embedding_and_head_as_trained").evidence
    )
    sglang = run_doctor(draft, target=target, engine="sglang").finding(
        "embedding_and_head_as_trained"
    )
    assert (
        sglang.verdict == "fail"
        and "SGLang puts the target's embedding in place of the drafter's own" in sglang.evidence
    )
    assert "which differs from it" in sglang.evidence and sglang.fix.startswith(
        "serve it with vLLM"
    )


def test_doctor_fails_a_config_without_draft_vocab_size_for_sglang(tmp_path):
    draft, target = draft_checkpoint(tmp_path, layout="sglang")
    edit_config(draft, lambda c: c.pop("draft_vocab_size"))
    finding = run_doctor(draft, target=target, engine="sglang").finding(
        "embedding_and_head_as_trained"
    )
    assert (
        finding.verdict == "fail"
        and "SGLang loads the target's lm_head in place of the trained one" in finding.evidence
    )


def test_export_writes_both_sizes_and_refuses_sglang(owned, tmp_path):
    draft, target, embedding = owned
    for engine in ("vllm", "speculators"):
        export_draft(draft, tmp_path / engine, engine=engine, target=target)
        config = json.loads((tmp_path / engine / "config.json").read_text())
        assert config["target_hidden_size"] == 32 and config["draft_vocab_size"] == 64, engine
        back = load_draft(tmp_path / engine, target_num_layers=5).model
        assert torch.equal(back.embed_tokens.weight, embedding), engine
    with pytest.raises(
        ExportError,
        match="SGLang puts the target's embedding in place of the drafter's own "
        "embed_tokens, which differs from it",
    ) as refused:
        export_draft(draft, tmp_path / "sglang", engine="sglang", target=target)
    assert "conventions" not in str(refused.value) and "export --engine vllm or speculators" in str(
        refused.value
    )


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """(drafter owning a bit-exact copy of the target's embedding, as SpecForge's frozen one, target)."""
    from specdraft.targets import target_embedding

    draft, target = draft_checkpoint(tmp_path_factory.mktemp("frozen"), layout="sglang")
    edit_weights(draft, lambda t: t.update({OWN: target_embedding(target).clone()}))
    return draft, target


def test_sglang_export_and_doctor_agree_on_an_embedding_identical_to_the_targets(frozen, tmp_path):
    draft, target = frozen
    result = export_draft(draft, tmp_path / "sglang", engine="sglang", target=target)
    assert any(
        "embed_tokens.weight is kept: SGLang runs the target's embedding, identical to the drafter's "
        "own" in note
        for note in result.notes
    )
    back = load_draft(tmp_path / "sglang", target_num_layers=5).model
    assert back.cfg.embedding_owned  # the files hold it, bit-exactly (export re-reads every tensor)
    for path in (draft, tmp_path / "sglang"):
        finding = run_doctor(path, target=target, engine="sglang").finding(
            "embedding_and_head_as_trained"
        )
        assert finding.verdict == "pass", path
        assert (
            "SGLang runs it with the target's embedding, identical to the drafter's own"
            in finding.evidence
        )


def test_the_one_sglang_embedding_rule():
    from specdraft.conventions.engines import sglang_embedding

    same = {"hidden_size": 32, "target_hidden_size": 32}
    own = torch.randn(8, 32, generator=torch.Generator().manual_seed(4)).half()
    assert sglang_embedding(same, own, lambda: own.float()) == (
        True,
        "the target's embedding, identical to the drafter's own embed_tokens",
    )
    assert sglang_embedding(same, own, lambda: own.float() + 1)[0] is False
    assert sglang_embedding(same, own, lambda: None) == (
        False,
        "SGLang puts the target's embedding in place of "
        "the drafter's own embed_tokens; not compared with the "
        "target's (pass --target DIR)",
    )
    assert (
        sglang_embedding({"hidden_size": 32, "target_hidden_size": 64}, own, lambda: 1 / 0)[0]
        is True
    )
    assert sglang_embedding(same, None, lambda: 1 / 0)[0] is True


def test_a_bf16_embedding_in_an_fp16_drafter_is_judged_as_stored(tmp_path):
    """The loader casts every tensor to fc's dtype (bf16 -> fp16 loses tiny values): export judges the
    embedding as the file stores it, as doctor does, and says the cast (the fresh-user sf-drafter3)."""
    from safetensors.torch import load_file, save_file

    draft, target = draft_checkpoint(tmp_path, layout="sglang")
    tensors = load_file(target / "model.safetensors")
    key = next(k for k in tensors if k.endswith("embed_tokens.weight"))
    embedding = tensors[key].to(torch.bfloat16)
    embedding[0, :4] = 1e-7  # below fp16's smallest subnormal: 0 after the loader's cast
    save_file({**tensors, key: embedding}, target / "model.safetensors", metadata={"format": "pt"})
    edit_weights(
        draft,
        lambda t: t.update(
            {**{k: v.half() for k, v in t.items() if v.is_floating_point()}, OWN: embedding.clone()}
        ),
    )
    result = export_draft(draft, tmp_path / "sglang", engine="sglang", target=target)
    assert any(
        "identical to the drafter's own embed_tokens (set_embed), so as trained; written as torch.float16 "
        "like every tensor here (the source stores it as torch.bfloat16)" in note
        for note in result.notes
    )
    assert (
        run_doctor(draft, target=target, engine="sglang")
        .finding("embedding_and_head_as_trained")
        .verdict
        == "pass"
    )
