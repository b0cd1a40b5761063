"""What training raises for bad input: each a `SpecdraftError` (one line naming the value or
file and the fix), each also the builtin exception it was before, so that callers catching
`ValueError`, `FileExistsError` or `FileNotFoundError` keep working. A resume on other data or
settings than the checkpoint's is `errors.SettingsMismatch`.
"""

from __future__ import annotations

from specdraft.errors import SpecdraftError


class TrainingError(SpecdraftError, RuntimeError):
    """Training cannot go on (non-finite loss, a batch without supervision); names the samples."""


class BadTrainSetting(TrainingError, ValueError):
    """A setting or input this run cannot train with: a batch size the ranks and micro-batches
    cannot share, bf16 off CUDA, too little data, aux layers or a target the data does not hold."""


class RunDirInUse(SpecdraftError, FileExistsError):
    """OUT cannot receive this run: a file, a directory of other files, or a directory holding
    checkpoints while --resume is not given."""


class TargetConfigNotFound(SpecdraftError, FileNotFoundError):
    """The target's config.json that training on a capture store needs cannot be found."""
