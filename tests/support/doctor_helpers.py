"""Tiny worlds for the export and doctor tests: target directories, drafters with manifests,
and one briefly trained drafter whose acceptance depends on its aux layers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.checkpoint import Manifest, save_draft
from specdraft.data.render import Sample
from specdraft.draft_config import DraftConfig
from specdraft.export import export_draft
from specdraft.targets import load_target
from specdraft.train.loop import train
from specdraft.train.sources import OnlineData
from tests.support.drafts import seeded_draft
from tests.support.tiny_models import save_tiny_model, tiny_config
from tests.support.train_world import small_config, write_fp32_store


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run faster on one thread, and much faster on a shared, loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sglang_launch(algorithm: str = "EAGLE3", **speculative) -> str:
    """An SGLang launch line of target T and drafter D as a user pastes it to doctor:
    `--speculative-algorithm ALGORITHM`, then `--speculative-<name> <value>` for each of
    `speculative` in the order given (underscores written as dashes)."""
    flags = " ".join(f"--speculative-{k.replace('_', '-')} {v}" for k, v in speculative.items())
    return (
        f"python -m sglang.launch_server --model-path T --speculative-algorithm {algorithm} "
        f"--speculative-draft-model-path D {flags}"
    )


def target_fields(target_dir: Path, aux_layers) -> dict:
    """The manifest fields training records about a target (train.sources.OnlineData's)."""
    target = load_target(target_dir)
    return OnlineData(
        target, [Sample([1, 2, 3], [0, 1, 1])], tuple(aux_layers)
    ).info.manifest_fields


def draft_checkpoint(
    root: Path,
    *,
    arch: str = "llama",
    num_layers: int = 5,
    aux=(2, 3, 4),
    draft_vocab_size: int = 64,
    layout: str = "specdraft",
    seed: int = 0,
    training: dict | None = None,
    draft_kw: dict | None = None,
    **target_kw,
) -> tuple[Path, Path]:
    """(draft dir, target dir): a seeded drafter (non-trivial norms, d2t = even target ids; `draft_kw`
    overrides DraftConfig fields, e.g. norm flags) for a tiny saved target, with a manifest as
    training writes it."""
    target_dir = save_tiny_model(arch, root / "target", num_layers=num_layers, **target_kw)
    config = tiny_config(arch, num_layers=num_layers, **target_kw)
    cfg = DraftConfig.from_target(
        config.get_text_config(), aux, draft_vocab_size=draft_vocab_size, **(draft_kw or {})
    )
    model = seeded_draft(cfg, seed)
    manifest = Manifest(
        draft=cfg.to_dict(),
        aux_layers=list(aux),
        training=training,
        **target_fields(target_dir, aux),
    )
    save_draft(model, root / "draft", layout=layout, manifest=manifest)
    return root / "draft", target_dir


def sglang_export(root: Path) -> tuple[Path, Path]:
    """(root/sglang, target): `draft_checkpoint(root)`'s healthy drafter exported for SGLang."""
    draft, target = draft_checkpoint(root)
    export_draft(draft, root / "sglang", engine="sglang", target=target)
    return root / "sglang", target


def edit_config(directory: Path, edit) -> dict:
    """Apply `edit(config_dict)` to directory/config.json; returns the new config."""
    file = Path(directory) / "config.json"
    config = json.loads(file.read_text())
    edit(config)
    file.write_text(json.dumps(config, indent=2))
    return config


def edit_weights(directory: Path, edit) -> None:
    """Apply `edit(tensors)` to directory/model.safetensors."""
    file = Path(directory) / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def rename_layer(tensors: dict, old: str, new: str) -> None:
    """Move every tensor under prefix `old` to prefix `new` (case S1)."""
    for key in [k for k in tensors if k.startswith(old)]:
        tensors[new + key[len(old) :]] = tensors.pop(key)


# ---------------------------------------------------------------------------------------------
# A trained drafter that needs its aux layers

VOCAB = 128
TRAINED_LAYERS = (0, 3, 7)


@dataclass
class TrainedWorld:
    """A 12-layer target, a drafter trained 400 steps on its aux layers [0, 3, 7], samples."""

    target: Path
    draft: Path
    samples: Path
    store: Path


_WORLD: dict[str, TrainedWorld] = {}


def random_samples(n: int, seed: int = 0) -> list[Sample]:
    """Random token sequences of 20-31 tokens, supervised from the third token on."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (int(torch.randint(20, 32, (1,), generator=g)),), generator=g)
        out.append(Sample(ids.tolist(), [0, 0] + [1] * (len(ids) - 2)))
    return out


def context_target(path: Path):
    """A 12-layer target whose next-token choice depends on the previous token, not only the
    current one: every layer attends uniformly over a 2-token window (Mistral sliding window
    2, zero q/k) and writes strongly into the residual stream (o_proj x 8); lm_head x 8 makes
    its distributions peaked. A random Llama is close to a bigram model, where a drafter can
    ignore its aux states, so wrong aux layers would barely show."""
    target = load_target(
        tiny_config("mistral", num_layers=12, hidden_size=32, vocab_size=VOCAB, sliding_window=2),
        seed=0,
    )
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
        for layer in target.model.model.layers:
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.k_proj.weight.zero_()
            layer.self_attn.o_proj.weight.mul_(8.0)
    target.model.save_pretrained(path)
    return target


def train_on_store(target, samples: list[Sample], root: Path, aux_layers, total_steps: int):
    """Capture `samples` from `target` (a loaded specdraft Target saved under root/"target") on
    `aux_layers` into root/"store", and train a drafter there for `total_steps` steps (draft
    vocabulary 96, 3 TTT steps, a validation split) into root/"run"; returns the TrainResult."""
    write_fp32_store(target, samples, root, tuple(aux_layers), shard_tokens=8192)
    config = small_config(total_steps=total_steps, eval_every=1000, save_every=1000)
    return train(config, root / "store", root / "run", progress=False)


def write_samples(path: Path, samples: list[Sample]) -> Path:
    """`samples` as a JSONL of token ids ({"input_ids", "loss_mask"}), doctor's --samples."""
    path.write_text(
        "".join(
            json.dumps({"input_ids": s.input_ids, "loss_mask": s.loss_mask}) + "\n" for s in samples
        )
    )
    return path


def trained_world(tmp_path_factory) -> TrainedWorld:
    """Build once per test process (about 7 s on one CPU thread)."""
    if "world" not in _WORLD:
        with torch.random.fork_rng(devices=[]):
            root = tmp_path_factory.mktemp("trained")
            target = context_target(root / "target")
            samples = random_samples(200)
            result = train_on_store(target, samples, root, TRAINED_LAYERS, 400)
            write_samples(root / "samples.jsonl", samples[:32])
        _WORLD["world"] = TrainedWorld(
            root / "target", result.draft_dir, root / "samples.jsonl", root / "store"
        )
    return _WORLD["world"]


def served_world(root: Path, tokenizer) -> tuple[Path, Path, Path]:
    """(draft dir, target dir with `tokenizer`, samples.jsonl) under root for doctor --server
    tests: the engine tests' tiny smooth Llama and its briefly trained drafter (accepted ~50 %),
    saved with a manifest, and 8 token-id samples."""
    import shutil

    from tests.support.engine_helpers import AUX_LAYERS, random_prompts, tiny_setup

    setup = tiny_setup("llama", "smooth")
    target = root / "target"
    shutil.copytree(setup.target_dir, target)
    tokenizer.save_pretrained(target)
    manifest = Manifest(
        draft=setup.trained.cfg.to_dict(),
        aux_layers=list(AUX_LAYERS),
        **target_fields(target, AUX_LAYERS),
    )
    save_draft(setup.trained, root / "draft", manifest=manifest)
    samples = root / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"input_ids": p, "loss_mask": [1] * len(p)}) + "\n"
            for p in random_prompts(8, 16, seed=5)
        )
    )
    return root / "draft", target, samples


def unsupported_target(root: Path, config_class: str) -> tuple[Path, Path]:
    """(drafter dir without manifest, target dir holding only config.json) for a 7-layer target of
    `config_class` (transformers' name, e.g. "Olmo2Config", a class no engine rule covers, or
    "Qwen3_5TextConfig", "Gemma4TextConfig"), its architecture the matching ...ForCausalLM."""
    import transformers

    from tests.support.tiny_models import _dense_kwargs

    sizes = _dense_kwargs(7, 32, 128, 8)
    config = getattr(transformers, config_class)(**sizes)
    config.architectures = [re.sub("(Text)?Config$", "ForCausalLM", config_class)]
    (root / "target").mkdir(parents=True)
    (root / "target" / "config.json").write_text(config.to_json_string())
    # the drafter of a Llama of the same sizes (Gemma 4's per-layer config has no global head_dim)
    cfg = DraftConfig.from_target(transformers.LlamaConfig(**sizes), (2, 3, 4), draft_vocab_size=64)
    save_draft(seeded_draft(cfg), root / "draft", layout="sglang")
    return root / "draft", root / "target"
