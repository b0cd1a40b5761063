"""The tokenizer saved in a target's directory, read one way by every command that needs it
(generate, serve, tune and bench's loads, doctor, export, inspect's audit, capture, regenerate, the
demo, DFlash's mask token): `load_target_tokenizer`, whose refusal is one line naming the
directory and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.errors import UnusableInput

# The files a tokenizer's vocabulary is read from: fast (tokenizer.json), sentencepiece
# (tokenizer.model), BPE (vocab.json + merges.txt), WordPiece (vocab.txt); tokenizer_config.json
# alone holds none.
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")

TOKENIZER_FIX = "save the target's tokenizer into its directory"


class TargetTokenizerError(UnusableInput):
    """A directory whose tokenizer transformers cannot load: `reason` (naming the directory) and
    `fix`, the message "reason; fix"."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


def load_target_tokenizer(directory: str | Path, fix: str = TOKENIZER_FIX) -> Any:
    """The tokenizer saved in `directory` (transformers' AutoTokenizer, local files only).

    Raises TargetTokenizerError, with `fix` (default TOKENIZER_FIX), when the directory has no
    VOCABULARY_FILES and transformers loads none or builds an empty tokenizer from none (it does
    for some classes, Qwen3.5's), or when transformers cannot read the files it has (its reason,
    on one line)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise TargetTokenizerError(_unloadable(Path(directory), e), fix) from None
    if len(tokenizer) <= 1:
        raise TargetTokenizerError(
            f"{_no_files(Path(directory))}: transformers built an empty {type(tokenizer).__name__}",
            fix,
        )
    return tokenizer


def _no_files(directory: Path) -> str:
    return f"{directory} has no tokenizer files ({' / '.join(VOCABULARY_FILES[:2])})"


def _unloadable(directory: Path, e: Exception) -> str:
    """Why `directory`'s tokenizer did not load (`e`: transformers' error): no vocabulary file,
    or transformers' reason for the files it has, on one line."""
    if not any((directory / name).is_file() for name in VOCABULARY_FILES):
        return _no_files(directory)
    reason = " ".join(str(e).split()) or type(e).__name__
    return f"{directory}: transformers cannot read its tokenizer files ({reason})"
