"""train.dflash_train's missing-mask-token error: it suggests the id `specdraft demo` would use
(targets.mask_token.dflash_mask_token) on the target directory the data records."""

from __future__ import annotations

import pytest
import torch

from specdraft.targets.mask_token import dflash_mask_token
from specdraft.train.dflash_train import default_mask_token
from specdraft.train.errors import BadTrainSetting
from specdraft.train.sources import TargetInfo
from tests.support.tiny_models import save_tiny_model
from tests.support.tiny_tokenizer import tiny_chat_tokenizer


def info(name_or_path: str, rows: int, limit: int | None) -> TargetInfo:
    return TargetInfo(
        config={},
        aux_layers=(1, 2, 3),
        embed_weight=torch.zeros(rows, 4),
        manifest_fields={"target": {"name_or_path": name_or_path}},
        vocab_limit=limit,
    )


def test_no_spare_row_suggests_the_demos_mask_token(tmp_path):
    target = save_tiny_model("llama", tmp_path / "target", vocab_size=85)  # the tokenizer's 85
    tokenizer = tiny_chat_tokenizer()
    tokenizer.save_pretrained(target)
    assert tokenizer.unk_token_id is not None
    assert dflash_mask_token(target) == tokenizer.unk_token_id  # no spare row: <unk>
    with pytest.raises(BadTrainSetting) as raised:
        default_mask_token(info(str(target), 85, 85))
    assert (
        f'draft_overrides {{"mask_token_id": {tokenizer.unk_token_id}}} (the tokenizer\'s '
        "unknown token, as the demo uses)"
    ) in str(raised.value)


def test_a_target_not_on_this_machine_leaves_the_id_to_the_user(tmp_path):
    with pytest.raises(BadTrainSetting, match='draft_overrides {"mask_token_id": ID}$'):
        default_mask_token(info(str(tmp_path / "gone"), 85, 85))
    assert default_mask_token(info(str(tmp_path / "gone"), 90, 85)) == 85  # a spare row: its id
