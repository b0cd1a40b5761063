"""pycode-25m and its drafter embedded exactly in a larger Llama shape (a "shell"): every kernel
does the large model's work, while outputs, hidden states and acceptance are the small pair's
(dense kernels do not skip zeros). Issue #25.

The construction (small: hidden H, head_dim d, L layers; shell: H' >= H, D >= d, L' >= L):
- residual stream: the small H dims first, zeros after; no layer writes past H;
- RMSNorm over H' dims sees mean square x H/H': norm weights x sqrt(H/H'), eps x H/H';
- small head i -> shell head i (same GQA group size), small head dims j and j + d/2 -> shell
  dims j and j + D/2 (rotate-half pairs); rope_theta' = theta^(D/d) keeps every used frequency
  (and any per-frequency scaling, linear or llama3, with it); q x sqrt(D/d) keeps the
  1/sqrt(head_dim) softmax scale; unused heads get zero q/k/v rows and zero o_proj columns;
- MLP: the small intermediate rows first, zeros after (silu(0) * 0 = 0);
- the small layer k (1-based) is shell layer k * L' // L; the others are identities (every
  weight zero, so o_proj = down_proj = 0); aux index k -> the shell index of that layer;
- the drafter the same way: `fc` [H', 3H'] with the trained block in each third; q/k/v read
  cat(embed, hidden), 2H' wide, so the trained columns sit at 0..H-1 and H'..H'+H-1; draft
  vocabulary and d2t unchanged; the drafter MLP is the shell's intermediate size wide;
- the vocabulary stays the small model's (4096): the shell's lm_head is far smaller than
  Llama-3's 128k one, so its memory roofline is computed from its own bytes.

    python benchmarks/shell_target.py --model M --check                     # CPU: the shell equals the pair
    python benchmarks/shell_target.py --model M --save out/                 # out/target, out/draft (load_engine)
    python benchmarks/shell_target.py --model M --bench --tune --out results.jsonl  # CUDA: the table, tune
    python benchmarks/shell_target.py --model M --bench --phases --settings chain6,tree5x4_16  # host ms per method
    python benchmarks/shell_target.py --model M --check --tiny-dflash       # CPU: a DFlash drafter too
    python benchmarks/shell_target.py --model M --draft E --draft D --bench --settings plain,chain7,dflash

A DFlash drafter (a second --draft, or --tiny-dflash for --check) is embedded by shell_dflash.py
(the same construction; its module docstring states the differences); its settings are "dflash"
(the whole block's drafts) and "dflashN" (the first N), each table row also carries
`roofline_multiple` (tokens/s over the setup line's roofline). The placement rules shared by both
drafters are shell_layout.py's.

--bench: plain, chains 1-7 and trees (BENCH_SETTINGS) with `SpeculativeEngine(compile=True)` in bf16,
each with tokens/s, tau, the GPU time of the engine's own verify graph and draft-round graph, the
kernel-cost model tau / (verify + draft round) and measured / model; the plain row also times the
target forward of each of VERIFY_SIZES tokens against the decode step. Results: benchmarks/RESULTS.md.

--model is the pycode-25m directory (../shared/models/pycode-25m); --draft (EAGLE-3 and/or DFlash,
at most one of each) defaults to the committed EAGLE-3 drafter (tests/assets/pycode25m_draft/draft).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from gpu_timing import replay_ms, sync  # benchmarks/, the script's directory
from safetensors.torch import load_file, save_file
from shell_dflash import (  # benchmarks/
    attach,
    block_logits,
    build_dflash,
    default_dflash_settings,
    dflash_round_ms,
    dflash_spec,
    load_dflash,
    tiny_dflash,
)
from shell_layout import (  # benchmarks/
    Embedding,
    Shape,
    Sources,
    drafter_shape,
    drafter_sizes,
    place,
    shell_layer,
)
from torch import Tensor

from specdraft.checkpoint import load_draft, save_draft
from specdraft.checkpoint.dflash import is_dflash_dir
from specdraft.dflash import DFlashDraft
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.engine.fast_config import ModelArgs
from specdraft.engine.fast_load import checkpoint_destinations, load_fast_target
from specdraft.engine.fast_model import FastTarget, causal_mask
from specdraft.engine.requests import Request
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from specdraft.engine.tree import TreeExpansion

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "tests" / "assets" / "pycode25m_draft"

SHAPES = {
    "llama-3-8b": Shape(4096, 32, 32, 8, 128, 14336),
    "check": Shape(1024, 12, 16, 4, 128, 2816),  # --check: D/d = 2, as in Llama-3-8B
    "tiny": Shape(576, 10, 12, 3, 96, 1536),  # the pytest: D/d = 1.5, theta' = theta^1.5
}


# ---- the target --------------------------------------------------------------------------------
def shell_config(config: dict, shape: Shape) -> dict:
    """The shell's transformers config: the small config with the shell's sizes, eps x H/H' and
    rope_theta^(D/d)."""
    emb = Embedding(Shape.of_config(config), shape)
    out = {
        **config,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6) * emb.eps_scale,
    }
    if isinstance(config.get("rope_parameters"), dict):
        params = config["rope_parameters"]
        out["rope_parameters"] = {
            **params,
            "rope_theta": emb.rope_theta(params.get("rope_theta", 10000.0)),
        }
    else:
        out["rope_theta"] = emb.rope_theta(config.get("rope_theta", 10000.0))
    return out


@torch.no_grad()
def fill_target(dest: dict[str, Tensor], small: Sources, emb: Embedding, tied: bool) -> None:
    """Write the shell's weights into `dest` (every transformers key of the shell -> its tensor,
    e.g. `checkpoint_destinations` of a FastTarget) from the small model's transformers tensors."""
    for tensor in dest.values():
        tensor.zero_()
    embed = small.take("model.embed_tokens.weight")
    place(dest["model.embed_tokens.weight"], embed)
    if "lm_head.weight" in dest:  # an untied head, or transformers' copy of the tied one
        place(dest["lm_head.weight"], embed if tied else small.take("lm_head.weight"))
    elif not tied:
        raise ValueError("the shell ties its head but the small model does not")
    place(dest["model.norm.weight"], small.take("model.norm.weight"), scale=emb.norm_scale)
    q_rows, kv_rows = emb.head_rows(emb.small.num_heads), emb.head_rows(emb.small.num_kv_heads)
    for k in range(1, emb.small.num_layers + 1):
        src, dst = f"model.layers.{k - 1}.", f"model.layers.{emb.layer(k) - 1}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            place(
                dest[dst + norm + ".weight"],
                small.take(src + norm + ".weight"),
                scale=emb.norm_scale,
            )
        attn = "self_attn."
        place(
            dest[dst + attn + "q_proj.weight"],
            small.take(src + attn + "q_proj.weight"),
            q_rows,
            scale=emb.q_scale,
        )
        for proj in ("k_proj", "v_proj"):
            place(
                dest[dst + attn + proj + ".weight"],
                small.take(src + attn + proj + ".weight"),
                kv_rows,
            )
        place(
            dest[dst + attn + "o_proj.weight"],
            small.take(src + attn + "o_proj.weight"),
            cols=q_rows,
        )
        for proj in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            place(dest[dst + proj + ".weight"], small.take(src + proj + ".weight"))
    small.check_all_used()


def read_small(model_dir: Path) -> tuple[dict, dict[str, Tensor]]:
    """config.json and every safetensors tensor (transformers names) of a Llama directory."""
    config = json.loads((model_dir / "config.json").read_text())
    if (
        config.get("model_type") != "llama"
        or config.get("attention_bias")
        or config.get("mlp_bias")
    ):
        raise ValueError(f"{model_dir}: the shell construction covers Llama targets without biases")
    tensors = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return config, tensors


def build_target(model_dir: Path, shape: Shape, device: str, dtype: torch.dtype) -> FastTarget:
    """The shell of the target in `model_dir` as a FastTarget on `device` (built in place)."""
    config, tensors = read_small(model_dir)
    args = ModelArgs.from_hf_config(shell_config(config, shape))
    with torch.device("meta"):
        model = FastTarget(args).to(dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    fill_target(
        checkpoint_destinations(model),
        Sources(tensors, str(model_dir)),
        Embedding(Shape.of_config(config), shape),
        args.tie_word_embeddings,
    )
    return model.requires_grad_(False).eval()


# ---- the drafter -------------------------------------------------------------------------------
def draft_shape(cfg: DraftConfig) -> Shape:
    """The EAGLE-3 drafter's sizes as a Shape (its one decoder layer)."""
    return drafter_shape(cfg, 1)


def shell_draft_config(cfg: DraftConfig, shape: Shape, target_layers: int) -> DraftConfig:
    """The drafter's config in the shell: the shell's widths and heads, the shell's intermediate
    size, aux layers mapped, rope_theta^(D/d), eps x H/H'."""
    if cfg.hidden_size != cfg.target_hidden_size:
        raise ValueError(
            "the shell construction covers drafters of the target's width (shared embedding)"
        )
    heads = Embedding(draft_shape(cfg), dataclasses.replace(shape, num_layers=1))
    return dataclasses.replace(
        cfg,
        **drafter_sizes(cfg, shape, heads),
        target_hidden_size=shape.hidden_size,
        aux_layers=tuple(shell_layer(k, target_layers, shape.num_layers) for k in cfg.aux_layers),
    )


@torch.no_grad()
def fill_draft(dest: dict[str, Tensor], small: Sources, emb: Embedding, n_aux: int) -> None:
    """Write the shell drafter's tensors (Eagle3Draft names) into `dest` from the small one's."""
    for name, tensor in dest.items():
        if name != "embed_tokens.weight":
            tensor.zero_()
    place(dest["fc.weight"], small.take("fc.weight"), cols=emb.hidden(n_aux))
    for norm in (
        "midlayer.input_layernorm",
        "midlayer.hidden_norm",
        "midlayer.post_attention_layernorm",
        "norm",
    ):
        place(dest[norm + ".weight"], small.take(norm + ".weight"), scale=emb.norm_scale)
    # the norms on the aux states (norm_before_fc: one over the n concatenated; EAGLE-3.1's
    # fc_norm: one per state), laid out as fc's columns
    if "input_norm.weight" in dest:
        place(
            dest["input_norm.weight"],
            small.take("input_norm.weight"),
            emb.hidden(n_aux),
            scale=emb.norm_scale,
        )
    for i in range(n_aux if "fc_norm.0.weight" in dest else 0):
        name = f"fc_norm.{i}.weight"
        place(dest[name], small.take(name), emb.hidden(1), scale=emb.norm_scale)
    both = emb.hidden(2)  # cat(embedding, hidden): the trained columns in each half
    attn = "midlayer.self_attn."
    place(
        dest[attn + "q_proj.weight"],
        small.take(attn + "q_proj.weight"),
        emb.head_rows(emb.small.num_heads),
        both,
        scale=emb.q_scale,
    )
    for proj in ("k_proj", "v_proj"):
        place(
            dest[attn + proj + ".weight"],
            small.take(attn + proj + ".weight"),
            emb.head_rows(emb.small.num_kv_heads),
            both,
        )
    place(
        dest[attn + "o_proj.weight"],
        small.take(attn + "o_proj.weight"),
        cols=emb.head_rows(emb.small.num_heads),
    )
    for proj in (
        "midlayer.mlp.gate_proj",
        "midlayer.mlp.up_proj",
        "midlayer.mlp.down_proj",
        "lm_head",
    ):
        place(dest[proj + ".weight"], small.take(proj + ".weight"))
    for buffer in ("d2t", "t2d"):
        dest[buffer].copy_(small.take(buffer))
    small.take(
        "embed_tokens.weight"
    )  # shared with the target: the shell's comes from the shell target
    small.check_all_used()


def build_draft(draft: Eagle3Draft, shape: Shape, target: FastTarget) -> Eagle3Draft:
    """The shell of `draft` (shape: the target's shell), sharing the shell target's embedding."""
    small_cfg = draft.cfg
    cfg = shell_draft_config(small_cfg, shape, small_cfg.target_num_layers)
    weight = target.tok_embeddings.weight
    with torch.device(weight.device):
        shell = Eagle3Draft(cfg).to(weight.dtype)
    emb = Embedding(
        draft_shape(small_cfg),
        dataclasses.replace(shape, num_layers=1, intermediate_size=cfg.intermediate_size),
    )
    fill_draft(shell.state_dict(), Sources(draft.state_dict(), "the drafter"), emb, cfg.n_aux)
    shell.load_target_embedding(weight)
    return shell.eval()


@dataclass
class Pair:
    target: FastTarget
    draft: Eagle3Draft | DFlashDraft | None


def build_pair(
    model_dir: Path, draft_dir: Path, shape: Shape | None, device: str, dtype: torch.dtype
) -> Pair:
    """The small pair (shape None) or its shell, on `device` in `dtype`."""
    if shape is None:
        target = load_fast_target(model_dir, dtype, device)
    else:
        target = build_target(model_dir, shape, device, dtype)
    loaded = load_draft(draft_dir, device=device, dtype=dtype)
    draft = loaded.model
    if shape is None:
        draft.load_target_embedding(target.tok_embeddings.weight)
        return Pair(target, draft.eval())
    return Pair(target, build_draft(draft, shape, target))


def save_pair(model_dir: Path, draft_dir: Path, shape: Shape, out: Path) -> None:
    """Write the shell as out/target (transformers directory with the tokenizer) and out/draft
    (specdraft layout, manifest updated), loadable by `load_engine(out/target, out/draft, ...)`."""
    config, _ = read_small(model_dir)
    pair = build_pair(model_dir, draft_dir, shape, "cpu", torch.bfloat16)
    (out / "target").mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in checkpoint_destinations(pair.target).items()}
    save_file(tensors, str(out / "target" / "model.safetensors"), metadata={"format": "pt"})
    (out / "target" / "config.json").write_text(json.dumps(shell_config(config, shape), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / "target" / name)
    manifest = load_draft(draft_dir).manifest
    cfg = pair.draft.cfg
    target_record = {
        **manifest.target,
        "hidden_size": shape.hidden_size,
        "num_layers": shape.num_layers,
        "config_hash": None,
        "name_or_path": str(out / "target"),
        "rope_theta": Embedding(Shape.of_config(config), shape).rope_theta(
            manifest.target["rope_theta"]
        ),
    }
    save_draft(
        pair.draft,
        out / "draft",
        layout="specdraft",
        manifest=dataclasses.replace(
            manifest, draft=cfg.to_dict(), target=target_record, aux_layers=list(cfg.aux_layers)
        ),
    )


# ---- the check (CPU, float32) ------------------------------------------------------------------
def load_prompts(
    model_dir: Path, count: int, tokens: int = 64, path: Path = ASSETS / "prompts.jsonl"
) -> list[list[int]]:
    """The first `tokens` ids of the first `count` prompts of `path` (JSON lines with "text"; by
    default the committed drafter's held-out prompts)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    with open(path) as f:
        return [tokenizer.encode(json.loads(line)["text"]).ids[:tokens] for line in f][:count]


@torch.inference_mode()
def prefill(
    target: FastTarget, ids: list[int], aux_layers: tuple[int, ...]
) -> tuple[Tensor, Tensor]:
    """(logits [T, V] float32, aux states [T, n_aux * hidden]) of one prompt from an empty cache."""
    n = len(ids)
    device = target.output.weight.device
    target.setup_cache(1, n)
    positions = torch.arange(n, device=device)
    out = target(
        torch.tensor([ids], device=device),
        positions[None],
        positions,
        causal_mask(0, n, n, device=device),
        aux_layers,
    )
    return out.logits[0], out.aux_hidden[0]


def generate_all(
    pair: Pair,
    spec: SpecConfig | None,
    prompts: list[list[int]],
    new_tokens: int,
    compile: bool = False,
    max_seq_len: int = 512,
) -> tuple[SpeculativeEngine, list[list[int]], list]:
    """(engine, outputs, per-prompt metrics) of greedy generation over the prompts."""
    device = pair.target.output.weight.device
    engine = SpeculativeEngine(
        pair.target, pair.draft if spec else None, spec, None, max_seq_len, device, compile=compile
    )
    results = [engine.generate(p, new_tokens) for p in prompts]
    return engine, [r.token_ids for r in results], [r.metrics for r in results]


CHECK_SETTINGS = {"plain": None, "chain3": SpecConfig.chain(3), "tree4x2_8": SpecConfig(4, 2, 8)}


def check(
    model_dir: Path,
    draft_dir: Path,
    shape: Shape,
    num_prompts: int,
    new_tokens: int,
    dflash: Path | str | None = None,
) -> dict:
    """The shell against the small pair, float32 on the CPU: the largest |logit difference| and
    |aux state difference| (the shell's aux states in the small model's H dims of each block;
    the rest must be 0) over the prompts' prefills, and per setting whether greedy outputs and
    tau (per prompt) are equal; with `dflash` (a DFlash drafter directory, or "tiny": one
    trained here, `tiny_check_dflash`) the same for it and its shell (`check_dflash`)."""
    small = build_pair(model_dir, draft_dir, None, "cpu", torch.float32)
    shell = build_pair(model_dir, draft_dir, shape, "cpu", torch.float32)
    prompts = load_prompts(model_dir, num_prompts)
    hidden, n_aux = small.target.args.hidden_size, small.draft.cfg.n_aux
    logits_diff = aux_diff = 0.0
    for ids in prompts:
        small_logits, small_aux = prefill(small.target, ids, small.draft.cfg.aux_layers)
        shell_logits, shell_aux = prefill(shell.target, ids, shell.draft.cfg.aux_layers)
        logits_diff = max(logits_diff, (shell_logits - small_logits).abs().max().item())
        blocks = shell_aux.view(len(ids), n_aux, -1)
        expected = torch.zeros_like(blocks)
        expected[..., :hidden] = small_aux.view(len(ids), n_aux, hidden)
        aux_diff = max(aux_diff, (blocks - expected).abs().max().item())
    report = {
        "shape": dataclasses.asdict(shape),
        "aux_layers": {
            "small": list(small.draft.cfg.aux_layers),
            "shell": list(shell.draft.cfg.aux_layers),
        },
        "max_abs_logits_diff": logits_diff,
        "max_abs_aux_diff": aux_diff,
        "settings": compare_settings(small, shell, CHECK_SETTINGS, prompts, new_tokens),
    }
    if dflash is not None:
        report["dflash"] = check_dflash(model_dir, small, shell, shape, prompts, new_tokens, dflash)
    return report


def compare_settings(
    small: Pair, shell: Pair, settings: dict, prompts: list[list[int]], new_tokens: int
) -> dict:
    """Per setting (name -> SpecConfig or None): whether the pairs' greedy outputs are equal, and
    each one's tau per prompt."""
    report = {}
    for name, spec in settings.items():
        _, small_out, small_m = generate_all(small, spec, prompts, new_tokens)
        _, shell_out, shell_m = generate_all(shell, spec, prompts, new_tokens)
        report[name] = {
            "outputs_equal": small_out == shell_out,
            "tau_small": [m.accept_length for m in small_m],
            "tau_shell": [m.accept_length for m in shell_m],
        }
    return report


def check_dflash(
    model_dir: Path,
    small: Pair,
    shell: Pair,
    shape: Shape,
    prompts: list[list[int]],
    new_tokens: int,
    dflash: Path | str,
) -> dict:
    """A DFlash drafter (`dflash`: its directory, or "tiny") and its shell on the small and shell
    targets: the largest |block logit difference| (a block after each prompt, anchored on its last
    token) and the DFlash settings' outputs and tau (`compare_settings`)."""
    if dflash == "tiny":
        draft = tiny_check_dflash(model_dir, small.target, prompts, new_tokens)
    else:
        layers = small.target.args.num_layers
        draft = attach(load_dflash(Path(dflash), layers, "cpu", torch.float32), small.target)
    shell_draft = build_dflash(draft, shape, shell.target)
    diff = 0.0
    for ids in prompts:
        _, small_aux = prefill(small.target, ids, draft.cfg.aux_layers)
        _, shell_aux = prefill(shell.target, ids, shell_draft.cfg.aux_layers)
        small_logits = block_logits(draft, small_aux, ids[-1])
        shell_logits = block_logits(shell_draft, shell_aux, ids[-1])
        diff = max(diff, (shell_logits - small_logits).abs().max().item())
    names = dict.fromkeys([f"dflash{min(3, draft.cfg.block_size - 1)}", "dflash"])
    settings = {name: dflash_spec(name, draft) for name in names}
    return {
        "draft": str(dflash),
        "block_size": draft.cfg.block_size,
        "target_layer_ids": {
            "small": list(draft.cfg.target_layer_ids),
            "shell": list(shell_draft.cfg.target_layer_ids),
        },
        "max_abs_block_logits_diff": diff,
        "settings": compare_settings(
            Pair(small.target, draft),
            Pair(shell.target, shell_draft),
            settings,
            prompts,
            new_tokens,
        ),
    }


def tiny_check_dflash(
    model_dir: Path, target: FastTarget, prompts: list[list[int]], new_tokens: int
) -> DFlashDraft:
    """`shell_dflash.tiny_dflash` trained on the small target's greedy continuations of the
    check's own prompts (`new_tokens` each): fitted to the text the check then drafts, so its
    blocks are accepted and the check compares multi-token rounds."""
    config, _ = read_small(model_dir)
    _, outputs, _ = generate_all(Pair(target, None), None, prompts, new_tokens)
    sequences = [p + out for p, out in zip(prompts, outputs)]
    n = config["num_hidden_layers"]
    aux = [prefill(target, ids, (2, n // 2, n - 3))[1] for ids in sequences]
    return tiny_dflash(target, config, sequences, aux, [len(p) for p in prompts])


def check_passed(report: dict, tolerance: float = 1e-4) -> list[str]:
    """What the check report fails (empty when it passes)."""
    dflash = report.get("dflash", {})
    failures = [
        f"{key} {part[key]:.3g} > {tolerance}"
        for part, key in (
            (report, "max_abs_logits_diff"),
            (report, "max_abs_aux_diff"),
            (dflash, "max_abs_block_logits_diff"),
        )
        if key in part and not part[key] <= tolerance
    ]
    for name, r in {**report["settings"], **dflash.get("settings", {})}.items():
        if not r["outputs_equal"]:
            failures.append(f"{name}: greedy outputs differ")
        if r["tau_small"] != r["tau_shell"]:
            failures.append(f"{name}: tau {r['tau_shell']} != the small pair's {r['tau_small']}")
    return failures


# ---- the speed table (CUDA, bf16, compile=True) -------------------------------------------------
BENCH_SETTINGS = {
    "plain": None,
    **{f"chain{n}": SpecConfig.chain(n) for n in range(1, 8)},
    "tree4x2_8": SpecConfig(4, 2, 8),
    "tree4x4_16": SpecConfig(4, 4, 16),
    "tree5x4_16": SpecConfig(5, 4, 16),
    "tree6x8_32": SpecConfig(6, 8, 32),
    "tree7x4_32": SpecConfig(7, 4, 32),
    "tree7x8_32": SpecConfig(7, 8, 32),
}
VERIFY_SIZES = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
)  # target forwards timed with plain decoding's engine
PASSES = 3  # over the prompts per setting: the table's tokens/s is their median


@torch.inference_mode()  # the engine's graph inputs are inference tensors
def verify_ms(engine: SpeculativeEngine, t: int, prefix: int) -> float:
    """GPU time of the engine's graphed target forward over T = t tokens after `prefix` cached
    ones (the graph with every input on the device; the engine's own placement differs only in
    the staging copy)."""
    size, device = engine.max_seq_len, engine.device
    ids, positions, slots, mask = engine.runner.graphed.device_inputs(t, size)
    graph = engine.runner.graphed.graph(t, size, (False,) * 4)[0]
    ids.random_(0, engine.target.args.vocab_size)
    positions.copy_(prefix + torch.arange(t, device=device)[None])
    slots.copy_(prefix + torch.arange(t, device=device))
    mask.copy_(causal_mask(prefix, t, size, device=device))
    return replay_ms(graph, 30, warmup=3)


@torch.inference_mode()
def draft_round_ms(engine: SpeculativeEngine, acceptance: list[float], prefix: int) -> float | None:
    """GPU time of a graphed greedy draft round, averaged over the rounds' numbers of pending
    positions m = accepted + 1 as the run saw them (P(accepted >= a) = acceptance[a - 1]); greedy
    rounds run ahead (`RoundsAhead`) draft every round after the first over its padded rows:
    that graph's time."""
    rounds = engine.proposer.rounds
    if rounds is None:
        return None
    if engine.rounds_ahead is not None:  # every round after the first: the padded round's one graph
        return replay_ms(engine.rounds_ahead.draft_graph, 30, warmup=3)
    steps = engine.spec.num_steps
    at_least = [1.0] + list(acceptance) + [0.0] * (steps + 1)
    total = 0.0
    for accepted in range(steps + 1):
        weight = at_least[accepted] - at_least[accepted + 1]
        m = min(accepted + 1, max(rounds.graphs))
        graph, (_, _, start), _ = rounds.graphs[m]
        start.fill_(prefix)
        total += weight * replay_ms(graph, 30, warmup=3) if weight > 0 else 0.0
    return total


def copy_bandwidth_gbs(num_bytes: int = 4 << 30, device: str = "cuda") -> float:
    """GB/s of a copy within `device` (CUDA: device to device): (read + written) bytes / median
    time."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(13):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    del src, dst
    return 2 * num_bytes / statistics.median(times[3:]) / 1e9


def weight_bytes(target: FastTarget) -> int:
    """Bytes a decode step reads: every weight but the input embedding (a tied head counts once)."""
    params = {id(p): p for n, p in target.named_parameters() if not n.startswith("tok_embeddings")}
    params[id(target.output.weight)] = target.output.weight
    return sum(p.numel() * p.element_size() for p in params.values())


def bench_setting(
    pair: Pair, spec: SpecConfig | None, prompts: list[list[int]], new_tokens: int
) -> tuple[dict, list]:
    """One row of the table: decode tokens/s (after each prefill; the median of PASSES passes
    over the prompts, each pass's too), tau, per-round times of the median pass (the engine's
    split and the GPU's kernels), and the outputs."""
    engine, _, _ = generate_all(
        pair, spec, [p for p in prompts[:2]], 16, compile=True
    )  # compiles, captures
    passes = []
    for _ in range(PASSES):
        results = [engine.generate(p, new_tokens) for p in prompts]
        seconds = sum(r.metrics.time_total_s - r.metrics.time_prefill_s for r in results)
        passes.append((sum(len(r.token_ids) - 1 for r in results) / seconds, seconds, results))
    _, seconds, results = sorted(passes, key=lambda run: run[0])[PASSES // 2]
    ms = [r.metrics for r in results]
    tokens = sum(len(r.token_ids) - 1 for r in results)
    rounds = sum(m.num_verify_steps for m in ms)
    merged = ms[0]
    for m in ms[1:]:
        merged = merged.merge(m)
    prefix = len(prompts[0]) + new_tokens // 2
    t = spec.num_draft_tokens if spec else 1
    kernel_verify = verify_ms(engine, t, prefix)
    tau = merged.accept_length
    eager_draft = None  # a DFlash round without its graphs
    if spec is None:
        kernel_draft = 0.0
    elif isinstance(pair.draft, DFlashDraft):  # a graph replay per round (compile=True)
        kernel_draft = dflash_round_ms(engine, prefix, max(1, round(tau)))
        eager_draft = dflash_round_ms(engine, prefix, max(1, round(tau)), eager=True)
    else:
        kernel_draft = draft_round_ms(engine, merged.acceptance_per_position, prefix)
    row = {
        "drafter": "dflash"
        if isinstance(pair.draft, DFlashDraft)
        else ("eagle3" if spec else None),
        "tokens_per_s": tokens / seconds,
        "tokens_per_s_passes": [run[0] for run in passes],
        "tau": tau,
        "verify_tokens": t,
        "rounds": rounds,
        "round_ms": 1e3 * seconds / rounds,
        "engine_split_ms_per_round": {
            k: 1e3 * getattr(merged, f"time_{k}_s") / rounds for k in ("draft", "verify", "other")
        },
        "kernel_verify_ms": kernel_verify,
        "kernel_draft_round_ms": kernel_draft,
        "acceptance_per_position": merged.acceptance_per_position,
        "kernels": {"target": engine.target_kernels, "draft": engine.draft_kernels},
    }
    if eager_draft is not None:
        row["kernel_draft_round_ms_eager"] = eager_draft
    if spec is None:  # the cost of a forward per token count, against the decode step
        curve = {n: verify_ms(engine, n, prefix) for n in VERIFY_SIZES}
        row |= {
            "verify_ms_by_tokens": curve,
            "verify_over_decode": {n: v / curve[1] for n, v in curve.items()},
        }
    if kernel_draft is not None:
        kernel = kernel_verify + kernel_draft
        model = 1e3 * tau / kernel
        row |= {
            "model_tokens_per_s": model,
            "measured_over_model": tokens / seconds / model,
            "host_ms_per_round": 1e3 * seconds / rounds - kernel,
        }
    del engine
    return row, [r.token_ids for r in results]


def bench(
    model_dir: Path,
    draft_dir: Path,
    shape: Shape,
    num_prompts: int,
    new_tokens: int,
    out: Path | None,
    run_tune: bool,
    settings: list[str] | None = None,
    prompt_file: Path = ASSETS / "prompts.jsonl",
    dflash_dir: Path | None = None,
) -> None:
    """The table on CUDA: every setting of BENCH_SETTINGS and, with a DFlash drafter at
    `dflash_dir`, its settings (`shell_dflash.default_dflash_settings`) -- or the `settings`
    named, "dflash" / "dflashN" for the DFlash ones -- one JSON line each: tokens/s, tau,
    speedup over plain, the multiple of the roofline (`roofline_multiple`) and the kernels."""

    def report(key: str, value) -> None:
        line = json.dumps({key: value}, default=str)
        print(line, flush=True)
        if out is not None:
            with out.open("a") as f:
                f.write(line + "\n")

    torch.manual_seed(0)
    start = time.perf_counter()
    pair = build_pair(model_dir, draft_dir, shape, "cuda", torch.bfloat16)
    dflash = None
    if dflash_dir is not None:
        small = load_dflash(dflash_dir, read_small(model_dir)[0]["num_hidden_layers"], "cuda", None)
        dflash = Pair(pair.target, build_dflash(small, shape, pair.target))
        del small
    torch.cuda.synchronize()
    bandwidth, weights = copy_bandwidth_gbs(), weight_bytes(pair.target)
    report(
        "setup",
        {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "shape": dataclasses.asdict(shape),
            "draft": str(draft_dir),
            "draft_config": pair.draft.cfg.to_dict(),
            "dflash_draft": str(dflash_dir) if dflash else None,
            "dflash_config": dflash.draft.cfg.to_dict() if dflash else None,
            "weight_bytes": weights,
            "copy_bandwidth_gb_s": bandwidth,
            "roofline_tokens_per_s": bandwidth * 1e9 / weights,
            "build_s": time.perf_counter() - start,
            "prompts": num_prompts,
            "new_tokens": new_tokens,
        },
    )
    prompts = load_prompts(model_dir, num_prompts, path=prompt_file)
    plain, decode_ms = None, None
    roofline = bandwidth * 1e9 / weights
    if settings is None:
        settings = list(BENCH_SETTINGS) + (default_dflash_settings(dflash.draft) if dflash else [])
    for name in settings:
        spec, use = setting_of(name, pair, dflash)
        try:
            row, outputs = bench_setting(use, spec, prompts, new_tokens)
        except Exception as e:  # noqa: BLE001 (report and go on with the other settings)
            report(name, {"error": f"{type(e).__name__}: {e}"})
            continue
        if spec is None:
            plain, decode_ms = (outputs, row["tokens_per_s"]), row["kernel_verify_ms"]
            row["model_tokens_per_s"] = 1e3 / decode_ms
            row["measured_over_model"] = row["tokens_per_s"] / row["model_tokens_per_s"]
        if plain is not None:
            row["speedup"] = row["tokens_per_s"] / plain[1]
            row["outputs_equal_plain"] = sum(a == b for a, b in zip(outputs, plain[0]))
            if decode_ms and "model_tokens_per_s" in row:
                row["model_speedup"] = row["model_tokens_per_s"] * decode_ms / 1e3
        row["roofline_multiple"] = row["tokens_per_s"] / roofline
        report(name, row)
    if run_tune:
        report("tune", tune_shell(pair, prompts))


def setting_of(name: str, pair: Pair, dflash: Pair | None) -> tuple[SpecConfig | None, Pair]:
    """(the SpecConfig, the pair that runs it) of a setting name: BENCH_SETTINGS' with the EAGLE-3
    pair, "dflash" / "dflashN" (`shell_dflash.dflash_spec`) with the DFlash one. Raises SystemExit
    for another name."""
    if name in BENCH_SETTINGS:
        return BENCH_SETTINGS[name], pair
    spec = dflash_spec(name, dflash.draft if dflash else None)
    if spec is None:
        raise SystemExit(
            f"setting {name}: choose among {', '.join(BENCH_SETTINGS)}, dflash, dflashN"
        )
    return spec, dflash


# (owner, method) of each timed phase: the proposer's, the target runner's (its forwards, a
# tree's commit), a request's emit (a proposal's `accept`, on a new object each round, is not timed)
ROUND_PHASES = (
    ("proposer", "propose"),
    ("runner", "forward_in_place"),
    ("runner", "forward"),
    ("runner", "commit"),
    ("proposer", "accepted"),
    ("request", "emit"),
)


def phase_times(pair: Pair, spec: SpecConfig, prompts: list[list[int]], new_tokens: int) -> dict:
    """Host milliseconds per round in each of the engine's round methods (wall time of the call,
    no added syncs: a method that reads the device back also waits for the GPU there), and in
    the target's cache compaction (inside `commit`), with how many rounds compacted."""
    engine, _, _ = generate_all(pair, spec, prompts[:2], 16, compile=True)
    spent: dict[str, float] = dict.fromkeys(
        [*(name for _, name in ROUND_PHASES), "compact_cache"], 0.0
    )
    calls: dict[str, int] = dict.fromkeys(spent, 0)

    def timed(owner, name: str) -> None:
        method = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
                calls[name] += 1

        wrapper.__wrapped__ = method
        setattr(owner, name, wrapper)

    owners = {"proposer": engine.proposer, "runner": engine.runner, "request": Request}
    for owner, name in ROUND_PHASES:
        timed(owners[owner], name)
    timed(pair.target, "compact_cache")
    try:
        results = [engine.generate(p, new_tokens) for p in prompts]
    finally:
        del pair.target.compact_cache  # the instance attribute: the class's method again
        Request.emit = Request.emit.__wrapped__  # the class's own method again
    rounds = sum(r.metrics.num_verify_steps for r in results)
    seconds = sum(r.metrics.time_total_s - r.metrics.time_prefill_s for r in results)
    return {
        "round_ms": 1e3 * seconds / rounds,
        "rounds": rounds,
        "ms_per_round": {k: 1e3 * v / rounds for k, v in spent.items()},
        "calls": calls,
    }


def tune_shell(pair: Pair, prompts: list[list[int]]) -> dict:
    """specdraft's tuner on the shell, its engines built with compile=True as the table's are
    (`tune` has no compile option: its module's SpeculativeEngine is replaced for the call), its
    search over the table's shapes: topk up to 8, trees up to 32 verified nodes (the Triton
    verify's cheap range; tune's default stops at 16), its requests as long as the table's."""
    import specdraft.bench.tune as tuner

    start = time.perf_counter()
    tuner.SpeculativeEngine = functools.partial(SpeculativeEngine, compile=True)
    try:
        report = tuner.tune(
            pair.target,
            pair.draft,
            prompts,
            tuner.TuneConfig(
                max_new_tokens=128, probe_steps=7, topks=(1, 2, 4, 8), max_tree_tokens=32, repeats=3
            ),
        )
    finally:
        tuner.SpeculativeEngine = SpeculativeEngine
    spec_text = tuner.spec_text
    rec = report.recommendation
    measured = {
        spec_text(c.spec): {
            "predicted_tps": c.predicted_tps,
            "measured_tps": c.measured_tps,
            "speedup": c.speedup,
            "tau": c.measured_tau,
        }
        for c in report.candidates
        if c.measured_tps
    }
    return {
        "recommendation": spec_text(rec.spec) if rec else None,
        "measured": measured,
        "plain_measured_tps": report.plain_measured_tps,
        "ties": [spec_text(c.spec) for c in report.ties()],
        "top_predicted": [
            {"spec": spec_text(c.spec), "predicted_tps": c.predicted_tps, "tau": c.predicted_tau}
            for c in report.candidates[:8]
        ],
        "seconds": time.perf_counter() - start,
    }


def split_drafts(drafts: list[Path]) -> tuple[Path, Path | None]:
    """(the EAGLE-3 drafter, the DFlash drafter or None) among the --draft directories (at most one
    of each kind: `checkpoint.dflash.is_dflash_dir`); the EAGLE-3 one defaults to the committed."""
    dflash = [d for d in drafts if is_dflash_dir(d)]
    eagle = [d for d in drafts if not is_dflash_dir(d)]
    if len(dflash) > 1 or len(eagle) > 1:
        raise SystemExit(f"--draft {drafts}: give at most one EAGLE-3 and one DFlash drafter")
    return (eagle or [ASSETS / "draft"])[0], (dflash or [None])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="the small target (the pycode-25m directory)"
    )
    parser.add_argument(
        "--draft",
        type=Path,
        action="append",
        help="its drafters, EAGLE-3 and/or DFlash, at most one of each (give --draft twice); "
        "default EAGLE-3: the committed one",
    )
    parser.add_argument(
        "--tiny-dflash",
        action="store_true",
        help="--check: also a test-sized DFlash drafter trained here (shell_dflash.tiny_dflash)",
    )
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), help="default: check for --check, else llama-3-8b"
    )
    parser.add_argument(
        "--check", action="store_true", help="CPU float32: the shell equals the small pair"
    )
    parser.add_argument("--save", type=Path, help="write the shell pair here (target/, draft/)")
    parser.add_argument("--bench", action="store_true", help="CUDA: the speed table")
    parser.add_argument(
        "--prompt-file",
        type=Path,
        default=ASSETS / "prompts.jsonl",
        help='--bench: JSON lines with "text" (default: the committed drafter\'s held-out prompts)',
    )
    parser.add_argument("--prompts", type=int, help="default: 4 (--check), 8 (--bench)")
    parser.add_argument("--new-tokens", type=int, help="default: 32 (--check), 128 (--bench)")
    parser.add_argument("--out", type=Path, help="--bench: also append the JSON lines here")
    parser.add_argument(
        "--tune", action="store_true", help="--bench: also run specdraft's tuner on the shell"
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="--bench: host time per round in each engine method instead of the table",
    )
    parser.add_argument(
        "--settings", help="--bench: comma-separated names of BENCH_SETTINGS (default: all)"
    )
    parser.add_argument(
        "--torch-expansion",
        action="store_true",
        help="--bench: draft rounds expand through torch ops, not kernels.expand_ops (A/B)",
    )
    args = parser.parse_args()
    args.draft, dflash_dir = split_drafts(args.draft or [])
    if args.torch_expansion:
        init = TreeExpansion.__init__
        TreeExpansion.__init__ = lambda self, *a, **kw: init(self, *a, **{**kw, "kernels": False})
    if args.check:
        torch.set_num_threads(min(2, torch.get_num_threads()))
        start = time.perf_counter()
        report = check(
            args.model,
            args.draft,
            SHAPES[args.shape or "check"],
            args.prompts or 4,
            args.new_tokens or 32,
            "tiny" if args.tiny_dflash else dflash_dir,
        )
        report["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(report))
        failures = check_passed(report)
        if failures:
            raise SystemExit("shell check failed: " + "; ".join(failures))
        print("shell check passed")
    if args.save:
        save_pair(args.model, args.draft, SHAPES[args.shape or "llama-3-8b"], args.save)
        print(f"wrote {args.save / 'target'} and {args.save / 'draft'}")
    if args.bench and args.phases:
        pair = build_pair(
            args.model, args.draft, SHAPES[args.shape or "llama-3-8b"], "cuda", torch.bfloat16
        )
        prompts = load_prompts(args.model, args.prompts or 8, path=args.prompt_file)
        for name in (args.settings or "chain6,tree5x4_16").split(","):
            times = phase_times(pair, BENCH_SETTINGS[name], prompts, args.new_tokens or 128)
            print(json.dumps({name: times}), flush=True)
    elif args.bench:
        bench(
            args.model,
            args.draft,
            SHAPES[args.shape or "llama-3-8b"],
            args.prompts or 8,
            args.new_tokens or 128,
            args.out,
            args.tune,
            args.settings.split(",") if args.settings else None,
            args.prompt_file,
            dflash_dir,
        )


if __name__ == "__main__":
    main()
