"""The DFlash mask token a target directory offers (`dflash_mask_token`): what `specdraft demo
--method dflash` trains with, and what `specdraft train --method dflash` suggests when the
trainer's default (the first id past the tokenizer) is no row of the target's embedding."""

from __future__ import annotations

from pathlib import Path

from specdraft.errors import UnusableInput


def dflash_mask_token(target_dir: str | Path) -> int:
    """The DFlash mask token of the target at `target_dir` (a local directory with its tokenizer
    and config.json): the first id past its tokenizer where its embedding has that row (the
    trainer's default, z-lab's recipe), else the tokenizer's unknown token (stories260K: <unk>,
    id 0, which its text never holds). UnusableInput naming --target when it has neither,
    TargetTokenizerError (an UnusableInput) when it has no tokenizer (`load_target_tokenizer`)."""
    from transformers import AutoConfig

    from specdraft.targets.tokenizer import load_target_tokenizer

    tokenizer = load_target_tokenizer(target_dir)
    rows = AutoConfig.from_pretrained(str(target_dir)).get_text_config().vocab_size
    if len(tokenizer) < rows:
        return len(tokenizer)
    if tokenizer.unk_token_id is not None:
        return tokenizer.unk_token_id
    raise UnusableInput(
        f"--target {target_dir}: no spare embedding row past its {len(tokenizer)}-token tokenizer "
        "and no unknown token for DFlash's mask token; train one with `specdraft train --method "
        'dflash --config` (draft_overrides {"mask_token_id": ID})'
    )
