"""A DFlash drafter in the shell (benchmarks/shell_target.py): the construction of its shell, a
test-sized drafter of the small target for `--check`, its settings and the timing of its round.

The construction is the EAGLE-3 drafter's (shell_target.py's docstring) with three differences
(`specdraft/dflash.py` states the drafter's math):
- `fc` [H', n·H'] reads n target states (the trained block in each H'-wide third, as EAGLE-3's);
  q/k/v read the normed block or context states, H wide, so the trained columns are 0..H-1;
- per-head q_norm / k_norm are RMSNorms over head_dim with the config's one eps, which the shell
  scales by H/H' (the hidden-size norms need it): with the small head dims at the rotate-half
  places of D, q_proj and k_proj rows x c = sqrt((H/H') / (d/D)) make the head's mean square
  c^2 (d/D) m = (H/H') m, so norm(c y) = y / sqrt(m + eps) x sqrt(D/d) exactly; q_norm keeps its
  weights (that sqrt(D/d) is the softmax's q scale), k_norm's are x sqrt(d/D);
- target_layer_ids (0-based: id i = specdraft index i + 1) map through `shell_layer`; the draft
  layers map one to one; embedding and lm_head are the shell target's (zeros past H).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
import types
from pathlib import Path

import torch
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

from specdraft.checkpoint.dflash import load_dflash_draft
from specdraft.dflash import DFlashConfig, DFlashDraft
from specdraft.engine.dflash_block import target_head
from specdraft.engine.spec_config import SpecConfig
from specdraft.train.dflash_loss import dflash_loss, sample_anchors

# --check's test-sized drafter (`tiny_dflash`): 2 layers, MLP 256, block 4, mask id 0
# (<|endoftext|>: pycode-25m's tokenizer fills its 4096-row embedding, no spare row), trained
# TINY_STEPS Adam steps, TINY_ANCHORS blocks per sequence
TINY = dict(num_hidden_layers=2, intermediate_size=256, block_size=4)
TINY_MASK_ID = 0
TINY_STEPS, TINY_ANCHORS = 100, 32


def dflash_shape(cfg: DFlashConfig) -> Shape:
    """The drafter's sizes as a Shape (its draft layers as num_layers)."""
    return drafter_shape(cfg, cfg.num_hidden_layers)


def shell_dflash_config(cfg: DFlashConfig, shape: Shape) -> DFlashConfig:
    """The drafter's config in the shell of target shape `shape`: its widths and heads, the wider
    of the two intermediate sizes, target layer ids mapped, rope_theta^(D/d), eps x H/H'."""
    emb = Embedding(dflash_shape(cfg), dataclasses.replace(shape, num_layers=cfg.num_hidden_layers))
    ids = tuple(
        shell_layer(i + 1, cfg.target_num_layers, shape.num_layers) - 1
        for i in cfg.target_layer_ids
    )
    return dataclasses.replace(cfg, **drafter_sizes(cfg, shape, emb), target_layer_ids=ids)


@torch.no_grad()
def fill_dflash(dest: dict[str, Tensor], small: Sources, emb: Embedding, num_ctx: int) -> None:
    """Write the shell drafter's tensors (DFlashDraft names) into `dest` from the small one's
    (the module docstring's construction; `emb.shell` has the shell drafter's intermediate size)."""
    for tensor in dest.values():
        tensor.zero_()
    place(dest["fc.weight"], small.take("fc.weight"), cols=emb.hidden(num_ctx))
    for norm in ("hidden_norm", "norm"):
        place(dest[norm + ".weight"], small.take(norm + ".weight"), scale=emb.norm_scale)
    head_ratio = emb.small.head_dim / emb.shell.head_dim  # d / D
    qk_scale = math.sqrt(emb.eps_scale / head_ratio)
    q_rows, kv_rows = emb.head_rows(emb.small.num_heads), emb.head_rows(emb.small.num_kv_heads)
    one_head = emb.head_rows(1)
    for i in range(emb.small.num_layers):
        layer = f"layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            name = layer + norm + ".weight"
            place(dest[name], small.take(name), scale=emb.norm_scale)
        attn = layer + "self_attn."
        for proj, rows, scale in (
            ("q_proj", q_rows, qk_scale),
            ("k_proj", kv_rows, qk_scale),
            ("v_proj", kv_rows, 1.0),
        ):
            name = attn + proj + ".weight"
            place(dest[name], small.take(name), rows, scale=scale)
        place(dest[attn + "o_proj.weight"], small.take(attn + "o_proj.weight"), cols=q_rows)
        place(dest[attn + "q_norm.weight"], small.take(attn + "q_norm.weight"), one_head)
        place(
            dest[attn + "k_norm.weight"],
            small.take(attn + "k_norm.weight"),
            one_head,
            scale=math.sqrt(head_ratio),
        )
        for proj in ("gate_proj", "up_proj", "down_proj"):
            name = layer + "mlp." + proj + ".weight"
            place(dest[name], small.take(name))
    small.check_all_used()


def attach(draft: DFlashDraft, target) -> DFlashDraft:
    """`draft` with `target`'s embedding and lm_head loaded (`dflash_block.target_head`), in eval
    mode."""
    draft.load_target_head(*target_head(target))
    return draft.eval()


def build_dflash(draft: DFlashDraft, shape: Shape, target) -> DFlashDraft:
    """The shell of `draft` (shape: the target's shell) on the shell `target`'s device and dtype,
    sharing its embedding and lm_head."""
    cfg = shell_dflash_config(draft.cfg, shape)
    weight = target.tok_embeddings.weight
    with torch.device(weight.device):
        shell = DFlashDraft(cfg).to(weight.dtype)
    emb = Embedding(
        dflash_shape(draft.cfg),
        dataclasses.replace(
            shape, num_layers=cfg.num_hidden_layers, intermediate_size=cfg.intermediate_size
        ),
    )
    sources = Sources(draft.state_dict(), "the DFlash drafter")
    fill_dflash(shell.state_dict(), sources, emb, len(cfg.target_layer_ids))
    return attach(shell, target)


def load_dflash(
    draft_dir: Path, target_num_layers: int, device: str, dtype: torch.dtype
) -> DFlashDraft:
    """The DFlash drafter directory draft_dir of a `target_num_layers`-layer target (strict:
    `checkpoint.dflash.load_dflash_draft`) on `device` in `dtype`, without a target head (`attach`
    loads one; `build_dflash` needs none)."""
    draft, _ = load_dflash_draft(
        draft_dir, device=device, dtype=dtype, target_num_layers=target_num_layers
    )
    return draft.eval()


def tiny_dflash(
    target, config: dict, sequences: list[list[int]], aux: list[Tensor], prompt_lens: list[int]
) -> DFlashDraft:
    """--check's test-sized DFlash drafter of the small FastTarget `target` whose transformers
    config is `config` (TINY's sizes, on its default aux layers [2, L//2, L-3]), trained TINY_STEPS Adam steps of the block loss on
    `sequences` (prompts of prompt_lens tokens, then the target's greedy continuation, the only
    supervised part; each cut to the shortest) with their aux states `aux` [T, 3·H]; seeded,
    float32, its head loaded, in eval mode."""
    length = min(len(s) for s in sequences)
    ids = torch.tensor([s[:length] for s in sequences])
    states = torch.stack([a[:length] for a in aux]).float()
    loss_mask = torch.zeros_like(ids)
    for row, n in enumerate(prompt_lens):
        loss_mask[row, n:] = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        n = config["num_hidden_layers"]
        cfg = DFlashConfig.from_target(config, (2, n // 2, n - 3), TINY_MASK_ID, **TINY)
        draft = attach(DFlashDraft(cfg), target).train()
    opt = torch.optim.Adam(draft.parameters(), lr=1e-2)
    with torch.enable_grad(), torch.inference_mode(False):
        for step in range(TINY_STEPS):
            seeds = [step * len(ids) + i for i in range(len(ids))]
            blocks = sample_anchors(loss_mask, cfg.block_size, TINY_ANCHORS, seeds)
            loss = dflash_loss(draft, ids, states, loss_mask, blocks).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return draft.eval()


@torch.inference_mode()
def block_logits(draft: DFlashDraft, aux: Tensor, anchor: int) -> Tensor:
    """The drafter's logits [block_size, V] float32 of the block [anchor, mask x (bs - 1)] at
    position len(aux) after the context states aux [T, n·H] (every key attended, as the engine's
    block does)."""
    cfg = draft.cfg
    t = aux.shape[0]
    block = torch.full((1, cfg.block_size), cfg.mask_token_id, device=aux.device)
    block[0, 0] = anchor
    positions = torch.arange(t + cfg.block_size, device=aux.device)[None]
    hidden = draft(block, aux[None].to(draft.fc.weight.dtype), positions, None)
    return draft.logits(hidden)[0].float()


DFLASH_SETTING = re.compile(r"dflash(\d*)")


def dflash_spec(name: str, draft: DFlashDraft | None) -> SpecConfig | None:
    """The chain of a DFlash setting name: "dflash" keeps the whole block's drafts
    (block_size - 1), "dflashN" the first N; None for a name of another kind. Raises SystemExit
    for a DFlash setting without a DFlash drafter (--draft) or past its block."""
    match = DFLASH_SETTING.fullmatch(name)
    if match is None:
        return None
    if draft is None:
        raise SystemExit(f"setting {name}: give a DFlash drafter directory as a --draft")
    drafts = int(match[1]) if match[1] else draft.cfg.block_size - 1
    if not 1 <= drafts <= draft.cfg.block_size - 1:
        raise SystemExit(
            f"setting {name}: {drafts} drafts; the drafter's block of {draft.cfg.block_size} "
            f"proposes 1..{draft.cfg.block_size - 1}"
        )
    return SpecConfig.chain(drafts)


def default_dflash_settings(draft: DFlashDraft) -> list[str]:
    """The DFlash rows of the table when --settings is not given: 3, 7, 11, 15 ... drafts up to
    the whole block."""
    last = draft.cfg.block_size - 1
    return [f"dflash{n}" for n in range(3, last, 4)] + ["dflash"]


@torch.inference_mode()
def dflash_round_ms(
    engine, prefix: int, pending: int, iters: int = 30, warmup: int = 3, eager: bool = False
) -> float:
    """Median time of a DFlash draft round in ms, as the engine runs it (eagerly, the host's
    launches inside the time; compiled, a `dflash_graph.GraphedBlock` replay): the context K/V
    of `pending` accepted positions appended after `prefix` cached ones, then one block forward
    and the drafts' argmax (`DFlashBlock.propose`; the caches' contents do not change the
    time). CUDA events on CUDA, wall time elsewhere. eager: a compiled engine's round run
    eagerly (its graphs set aside while measuring)."""
    proposer, graphs = engine.proposer, engine.proposer.graphs
    if eager:
        proposer.graphs = None
    try:
        return _median_round_ms(engine, prefix, pending, iters, warmup)
    finally:
        proposer.graphs = graphs


def _median_round_ms(engine, prefix: int, pending: int, iters: int, warmup: int) -> float:
    """`dflash_round_ms`'s measurement of `engine.proposer.propose` as it is set up."""
    proposer = engine.proposer
    width = proposer.draft.fc.in_features
    aux = torch.zeros(pending, width, dtype=proposer.dtype, device=engine.device)
    req = types.SimpleNamespace(pending_aux=aux, output_ids=[0])
    cuda = engine.device.type == "cuda"
    times = []
    for _ in range(warmup + iters):
        for cache in proposer.caches:
            cache.length = prefix  # a benchmark's seek: entries past a request's end are stale
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            proposer.propose(req)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            proposer.propose(req)
            times.append(1e3 * (time.perf_counter() - begin))
    return statistics.median(times[warmup:])
