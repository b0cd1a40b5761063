"""One test per published EAGLE-3 drafter config (issue #21 item 3): the config text from its
public source (tests/fixtures/published_configs, SOURCES.json names source and commit), its
sizes shrunk consistently, random tensors of the names and shapes it implies. Each loads with
the right aux layers, round-trips bit-exactly through every layout, and exports for vLLM, or is
refused with the reason.

EAGLE's own traineagle3 config names `LlamaForCausalLM`, which vLLM serves as its EAGLE-3
drafter (SGLang as its plain Llama): read as vLLM reads it, with a note (issue #34). A plain
class other than the trainer's under a drafter key stays refused with that reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from specdraft.checkpoint import (
    CheckpointError,
    Converted,
    convert_draft,
    load_draft,
    state_dict_for_layout,
    tensor_digest,
    write_safetensors,
)
from specdraft.checkpoint.config_read import norm_flags_of_config
from specdraft.draft_config import DraftConfig, method_label
from specdraft.export import export_draft
from specdraft.targets.config import TARGET_CLASSES
from tests.support.drafts import seeded_draft
from tests.support.tiny_models import tiny_config

FIXTURES = Path(__file__).parents[2] / "fixtures" / "published_configs"
# Consistent shrink: hidden 32 = 4 heads x 8, KV heads 2 (or 4 where the config has as many as heads).
SHRUNK = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "head_dim": 8,
    "vocab_size": 256,
}
DRAFT_VOCAB = 64


@dataclass(frozen=True)
class Published:
    file: str
    target: str  # the target's model_type
    num_layers: int  # the target's decoder layers (Llama-3.1-8B 32, Llama-4-Scout 48, ...)
    aux: list[int] | None  # specdraft indices it must load with; None when refused
    refuse: str | None = None  # words of the refusal
    owned_embedding: bool = False  # the file holds embed_tokens.weight
    t2d: bool = True  # the file holds t2d
    layer_names: str = "midlayer"  # the decoder layer's names in the file (ModelOpt: layers.0)
    full_vocab: bool = False  # lm_head over the whole vocabulary, no d2t / t2d (TorchSpec's Kimi)
    sglang_version: str | None = None  # where SGLang's reading of its ids depends on the version


PUBLISHED = [
    Published("specforge-llama3-8B-eagle3.json", "llama", 32, [2, 16, 29]),
    Published("specforge-llama4-scout-17B-16E-eagle3.json", "llama", 48, [2, 24, 45]),
    Published("specforge-qwen3-8b-eagle3.json", "qwen3", 36, [2, 18, 33]),
    Published("specforge-deepseek-v3-671b-eagle3.json", "deepseek_v3", 61, [2, 30, 58]),
    Published("specforge-qwen3-30B-A3B-eagle3.1.json", "qwen3", 48, [2, 24, 45]),
    Published("specforge-qwen3-vl-8b-eagle3.json", "qwen3_vl", 36, [2, 18, 33]),
    Published("specforge-qwen3-vl-30b-a3b-eagle3.json", "qwen3_vl_moe", 48, [2, 24, 45]),
    Published("eagle-traineagle3-config.json", "llama", 32, [2, 16, 29]),
    Published("speculators-0.9.0-converter-llama3-8b.json", "llama", 32, [2, 16, 29]),
    Published(
        "speculators-0.9.0-trainer-llama3-8b.json", "llama", 32, [2, 16, 29], owned_embedding=True
    ),
    Published(
        "modelopt-llama-eagle3-export.json",
        "llama",
        32,
        [2, 16, 29],
        t2d=False,
        layer_names="layers.0",
    ),
    Published("specforge-qwen25-7b-eagle3.json", "qwen2", 28, [2, 14, 25]),
    # Qwen2.5-VL (rope_scaling "type": "mrope"): its text model is Qwen2Model in both engines
    # (the "qwen" rules); the tiny target is its text model, a Qwen2 of the same layer count
    Published("specforge-qwen2-5-vl-7B-eagle3.json", "qwen2", 28, [2, 14, 25]),
    Published("specforge-qwen2-5-vl-3B-eagle3.json", "qwen2", 36, [2, 18, 33]),
    Published(
        "specforge-kimi-k25-eagle3.json", "deepseek_v3", 61, [2, 30, 58], sglang_version="0.5.23"
    ),
    Published(
        "specforge-gpt-oss-20B-eagle3.json",
        "gpt_oss",
        24,
        None,
        refuse="['GptOssForCausalLMEagle3'] is a draft architecture specdraft does not implement",
    ),
    Published(
        "torchspec-kimi-k25-eagle3.json",
        "deepseek_v3",
        61,
        [2, 30, 58],
        layer_names="layers.0",
        full_vocab=True,
    ),
    Published(
        "torchspec-qwen3-8b-eagle3-mla.json",
        "qwen3",
        36,
        None,
        refuse="['DeepSeekForCausalLMEagle3'] is a draft architecture specdraft does not implement",
    ),
    Published("angelslim-qwen3-30b-a3b-eagle3.json", "qwen3_moe", 48, [2, 24, 45]),
    Published("angelslim-qwen3-vl-4b-eagle3-mrope.json", "qwen3_vl", 36, [2, 18, 33]),
    Published(
        "angelslim-qwen2.5-7b-eagle3.json",
        "qwen2",
        28,
        None,
        refuse="num_hidden_layers = 28; specdraft implements the one-layer EAGLE-3 drafter",
    ),
]


def shrink(config: dict) -> dict:
    """The config with its sizes shrunk (`SHRUNK`), the layer config of a speculators file included."""
    out = json.loads(json.dumps(config))
    layer = out.get("transformer_layer_config", out)
    kv = 4 if layer.get("num_key_value_heads") == layer.get("num_attention_heads") else 2
    layer.update(
        {k: v for k, v in SHRUNK.items() if k != "head_dim" or "head_dim" in layer},
        num_key_value_heads=kv,
    )
    for where in (out, layer):
        if where.get("draft_vocab_size") is not None:
            where["draft_vocab_size"] = DRAFT_VOCAB
        if where.get("target_hidden_size") is not None:
            where["target_hidden_size"] = SHRUNK["hidden_size"]
    return out


def write_target(root: Path, case: Published) -> tuple[Path, str]:
    """A target directory (config.json only: ids and sizes need nothing else) and its class."""
    config = tiny_config(
        case.target, num_layers=case.num_layers, hidden_size=32, vocab_size=256, head_dim=8
    )
    path = root / "target"
    path.mkdir()
    (path / "config.json").write_text(config.to_json_string())
    return path, TARGET_CLASSES[config.get_text_config().model_type]


def write_drafter(root: Path, case: Published, config: dict) -> tuple[Path, dict]:
    """The drafter directory: the shrunk config.json and seeded tensors under the layout's names."""
    layer = config.get("transformer_layer_config", config)
    cfg = DraftConfig.from_target(
        {**layer, "num_hidden_layers": case.num_layers, "rope_scaling": None},  # rope: no tensor
        case.aux or [2, 3, 4],
        draft_vocab_size=None if case.full_vocab else DRAFT_VOCAB,
        embedding_owned=case.owned_embedding,
        **norm_flags_of_config(root, config),
    )
    layout = "speculators" if "speculators_model_type" in config else "sglang"
    tensors = state_dict_for_layout(seeded_draft(cfg), layout, case.layer_names)
    if not case.t2d:
        tensors.pop("t2d")
    if case.full_vocab:
        tensors.pop("d2t"), tensors.pop("t2d")
    path = root / "draft"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config, indent=2))
    write_safetensors(tensors, path / "model.safetensors")
    return path, tensors


@pytest.mark.parametrize("case", PUBLISHED, ids=[c.file.removesuffix(".json") for c in PUBLISHED])
def test_a_published_config(tmp_path, case):
    config = shrink(json.loads((FIXTURES / case.file).read_text()))
    target, target_class = write_target(tmp_path, case)
    draft, tensors = write_drafter(tmp_path, case, config)
    reading = {
        "target_num_layers": case.num_layers,
        "target_class": target_class,
        "sglang_version": case.sglang_version,
    }
    if case.refuse is not None:
        with pytest.raises(CheckpointError) as refused:
            load_draft(draft, **reading)
        assert case.refuse in str(refused.value) and str(draft) in str(refused.value), refused.value
        return
    loaded = load_draft(draft, **reading)
    assert list(loaded.model.cfg.aux_layers) == case.aux
    digests = {
        name: tensor_digest(t) for name, t in state_dict_for_layout(loaded.model, "sglang").items()
    }
    # ModelOpt writes d2t only: t2d is derived, not copied; no map at all: the identity, derived
    derived = ("d2t", "t2d") if case.full_vocab else () if case.t2d else ("t2d",)
    for layout in ("sglang", "speculators"):
        out = tmp_path / layout
        assert convert_draft(draft, out, layout=layout, **reading) == Converted(
            len(tensors), derived
        )
        back = load_draft(out, **reading).model
        assert list(back.cfg.aux_layers) == case.aux
        assert {
            n: tensor_digest(t) for n, t in state_dict_for_layout(back, "sglang").items()
        } == digests, layout
    result = export_draft(
        draft, tmp_path / "vllm", engine="vllm", target=target, sglang_version=case.sglang_version
    )
    written = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert written["eagle_aux_hidden_state_layer_ids"] == case.aux  # vLLM reads these ids as-is
    draft_vocab = 256 if case.full_vocab else DRAFT_VOCAB
    assert written["draft_vocab_size"] == draft_vocab and written["target_hidden_size"] == 32
    assert (result.num_tensors, result.derived) == (
        len(tensors),
        derived,
    )  # export writes the derived t2d too


def test_every_fixture_has_a_case_and_a_source():
    sources = json.loads((FIXTURES / "SOURCES.json").read_text())
    files = sorted(p.name for p in FIXTURES.glob("*.json") if p.name != "SOURCES.json")
    assert (
        files
        == sorted(c.file for c in PUBLISHED)
        == sorted(k for k in sources if not k.startswith("_"))
    )
    assert all(sources[f]["commit"] and sources[f]["source"] for f in files)


def _table_rows() -> dict[str, list[str]]:
    """docs/published_configs.md's first table: fixture file -> its cells (config, vLLM 0.32,
    SGLang < 0.5.12, SGLang >= 0.5.12, specdraft, verdict); each row names its fixture."""
    text = (Path(__file__).parents[3] / "docs" / "published_configs.md").read_text()
    rows = {}
    for line in text.split("\n\n## ")[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        named = [f for f in (c.file for c in PUBLISHED) if f"`{f}`" in cells[0]]
        if line.startswith("| ") and named:
            assert len(cells) == 6 and len(named) == 1, line
            rows[named[0]] = cells
    return rows


def test_the_table_names_every_fixture_with_the_verdict_its_case_tests():
    """Issue #34's table: one row per fixture; "refused" exactly where its case is refused, and a
    refused row is one no engine column says it loads (no drafter refused that an engine serves)."""
    rows = _table_rows()
    assert sorted(rows) == sorted(c.file for c in PUBLISHED)
    for case in PUBLISHED:
        config, *engines, specdraft, verdict = rows[case.file]
        assert verdict.startswith("refused") == (case.refuse is not None), config
        assert specdraft.startswith("refused") == (case.refuse is not None), config
        if case.refuse is not None:
            assert not [e for e in engines if e.startswith("loads")], config


@pytest.mark.parametrize(
    ("file", "theta"),
    [
        ("specforge-qwen3-vl-8b-eagle3.json", 5e6),
        ("specforge-qwen3-vl-30b-a3b-eagle3.json", 5e6),
        ("specforge-qwen2-5-vl-7B-eagle3.json", 1e6),  # legacy "type": "mrope"
        ("specforge-qwen2-5-vl-3B-eagle3.json", 1e6),
    ],
)
def test_specforge_vl_mrope_reads_as_rope_over_text_positions(tmp_path, file, theta):
    """SpecForge writes the target's M-RoPE sections into its Qwen3-VL / Qwen2.5-VL drafters (the
    latter as the legacy type "mrope", which both engines read as "default": config_reads.
    LEGACY_ROPE_TYPES); on a text-only prompt the three position rows are equal, so the drafter
    is 1-D RoPE at that theta (it was refused: "rope_scaling type 'mrope' is not implemented")."""
    case = next(c for c in PUBLISHED if c.file == file)
    config = shrink(json.loads((FIXTURES / file).read_text()))
    assert "mrope_section" in config["rope_scaling"]
    _, target_class = write_target(tmp_path, case)
    draft, _ = write_drafter(tmp_path, case, config)
    cfg = load_draft(draft, target_num_layers=case.num_layers, target_class=target_class).model.cfg
    assert (cfg.rope_theta, cfg.rope_scaling) == (theta, None)


def test_torchspec_convert_to_hf_names_midlayer_with_the_embedding_and_loads(tmp_path):
    """TorchSpec's tools/convert_to_hf.py saves its LlamaForCausalLMEagle3 (models/draft/
    llama3_eagle.py: `self.midlayer`, `self.embed_tokens`) with save_pretrained: `midlayer.*` and
    embed_tokens.weight, no d2t / t2d without --prune-vocab (docs/published_configs.md). That file
    loads too, the embedding read as the drafter's own."""
    import dataclasses

    case = next(c for c in PUBLISHED if c.file == "torchspec-kimi-k25-eagle3.json")
    case = dataclasses.replace(case, layer_names="midlayer", owned_embedding=True)
    config = shrink(json.loads((FIXTURES / case.file).read_text()))
    _, target_class = write_target(tmp_path, case)
    draft, tensors = write_drafter(tmp_path, case, config)
    assert "embed_tokens.weight" in tensors and "d2t" not in tensors
    assert any(k.startswith("midlayer.") for k in tensors)
    model = load_draft(draft, target_num_layers=case.num_layers, target_class=target_class).model
    assert list(model.cfg.aux_layers) == case.aux
    assert torch.equal(model.embed_tokens.weight, tensors["embed_tokens.weight"])


def test_the_eagle3_trainer_config_reads_as_vllm_reads_it_and_says_what_sglang_builds(tmp_path):
    """The official EAGLE-3 trainer writes architectures ["LlamaForCausalLM"]: vLLM (method eagle3)
    serves it as Eagle3LlamaForCausalLM, SGLang builds its plain Llama. It loads, the note says
    both; another plain class under a drafter key stays refused with the value to write."""
    from specdraft.checkpoint.config_notes import reading_notes

    case = next(c for c in PUBLISHED if c.file == "eagle-traineagle3-config.json")
    config = shrink(json.loads((FIXTURES / case.file).read_text()))
    _, target_class = write_target(tmp_path, case)
    draft, tensors = write_drafter(tmp_path, case, config)
    reading = {"target_num_layers": case.num_layers, "target_class": target_class}
    model = load_draft(draft, **reading).model
    assert torch.equal(model.fc.weight, tensors["fc.weight"]) and model.cfg.aux_layers == (
        2,
        16,
        29,
    )
    (note,) = [n for n in reading_notes(config) if "official EAGLE-3 trainer's" in n]
    assert "Eagle3LlamaForCausalLM" in note and "SGLang 0.5.23 as its plain Llama model" in note
    (draft / "config.json").write_text(
        json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]})
    )
    with pytest.raises(CheckpointError) as refused:
        load_draft(draft, **reading)
    message = str(refused.value)
    assert "names a plain model, not an EAGLE-3 drafter" in message
    assert 'set "architectures": ["LlamaForCausalLMEagle3"] in config.json' in message
    assert "conventions" not in message and "\n" not in message


@pytest.mark.parametrize(
    ("file", "label"),
    [
        ("specforge-qwen3-30B-A3B-eagle3.1.json", "eagle3.1 (fc_norm, norm_output)"),
        ("specforge-llama3-8B-eagle3.json", "eagle3 (no norm flag)"),
        (
            "speculators-0.9.0-trainer-llama3-8b.json",
            "EAGLE-3 variant (norm_before_residual, norm_before_fc, norm_output)",
        ),
    ],
)
def test_a_published_configs_norm_flags_name_its_method(tmp_path, file, label):
    """SpecForge's EAGLE-3.1 config is what --method eagle3.1 trains (`draft_config.EAGLE3_METHODS`
    was read from it); speculators' trainer default is another variant (gpt-oss's norm_before_fc)."""
    config = json.loads((FIXTURES / file).read_text())
    assert method_label(norm_flags_of_config(tmp_path, config)) == label
