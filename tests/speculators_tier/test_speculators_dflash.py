"""speculators 0.9.0's own DFlash model (`speculators.models.dflash`, registered as
speculators_model_type "dflash") loads specdraft's speculators DFlash export: the config values
it reads (block size, aux layers in specdraft indices, mask token, draft layers) are the
drafter's, and every tensor it holds from the file equals specdraft's. Written without a
speculators install at hand: not run outside the CI speculators tier."""

from __future__ import annotations

import pytest
import torch

from specdraft.checkpoint.dflash import save_dflash_draft
from specdraft.checkpoint.manifest import Manifest
from specdraft.dflash import DFlashDraft
from specdraft.export.dflash import export_dflash
from tests.support.dflash import tiny_dflash_cfg
from tests.support.tiny_models import save_tiny_model

pytestmark = pytest.mark.speculators


def test_speculators_loads_the_dflash_export_with_every_tensor(tmp_path):
    from speculators.models.dflash import DFlashDraftModel

    target = save_tiny_model("llama", tmp_path / "target", vocab_size=128)
    torch.manual_seed(0)
    draft = DFlashDraft(tiny_dflash_cfg(vocab_size=128, mask_token_id=127))
    manifest = Manifest(
        draft=draft.cfg.to_dict(),
        target={"num_layers": 4, "hidden_size": 32, "vocab_size": 128},
        aux_layers=[1, 2, 3],
        extra={"method": "dflash"},
    )
    source = save_dflash_draft(draft, tmp_path / "draft", manifest)
    out = export_dflash(source, tmp_path / "speculators", "speculators", target=target).out_dir
    theirs = DFlashDraftModel.from_pretrained(str(out)).float()
    config = theirs.config
    assert (config.block_size, config.mask_token_id) == (4, 127)
    assert list(config.aux_hidden_state_layer_ids) == [1, 2, 3]
    assert config.transformer_layer_config.num_hidden_layers == 2
    held = theirs.state_dict()
    for name, tensor in draft.state_dict().items():
        assert torch.equal(held[name], tensor), name
