"""Files that are never half written, and the settings an output was written with.

Every output specdraft writes goes to a temporary name beside its destination and is renamed
over it (`os.replace`, atomic on POSIX), so an interrupted run leaves the old file or the new
one, never a mix. What they write gets an ordinary file's mode (0666 less the umask), whatever
mode the writer created it with (safetensors and `save_pretrained` create owner-only files).
An output that a later run may resume (a capture store, a regenerated file,
a training run, the demo's stages) records its settings; `refuse_other_settings` compares a
resumed run's settings with them and names every field that differs. `unreadable` says in a
few words why a file a user gave could not be read, for the one-line error naming it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specdraft.errors import SettingsMismatch


def temp_path(path: Path) -> Path:
    """A hidden temporary name beside `path`, unique to this process: `.NAME.tmp-PID`."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def is_temp_path(path: Path) -> bool:
    """Whether `path` is named as a `temp_path` (of any process): what an interrupted write left."""
    name = Path(path).name
    return name.startswith(".") and ".tmp-" in name


def ordinary_mode(path: str | Path) -> None:
    """Give the file at `path` the mode an ordinary new file gets: 0666 less the process umask
    (0644 under the usual 022), so a server or a user other than the writer can read it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call `write(tmp)` to write the file's contents at a temporary path, then rename it to
    `path` (parents created). On any error the temporary file is removed and `path` is untouched.
    `write` is e.g. `torch.save` / `safetensors.torch.save_file` / `figure.savefig` bound to
    the object. The file gets `ordinary_mode`. Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        write(tmp)
        ordinary_mode(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_json(
    path: str | Path, value: Any, *, indent: int | None = 1, sort_keys: bool = True
) -> Path:
    """Write `value` as JSON (a trailing newline) to `path` atomically."""
    return atomic_write_text(path, json.dumps(value, indent=indent, sort_keys=sort_keys) + "\n")


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Build a directory at a temporary path, then put it in place of `path` (an existing
    directory there is replaced). An exception inside the block removes the temporary
    directory and leaves `path` as it was. Every file written inside gets `ordinary_mode`."""
    path = Path(path)
    tmp = temp_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for file in tmp.rglob("*"):
        if file.is_file() and not file.is_symlink():
            ordinary_mode(file)
    replace_dir(tmp, path)


def replace_dir(src: Path, dst: Path) -> None:
    """Move the directory `src` to `dst`, replacing what is there: the old `dst` is renamed
    aside first and removed after, so `dst` is always one whole directory."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def unreadable(e: OSError | UnicodeDecodeError) -> str:
    """Why reading a file failed, in a few words for a one-line error: the OS's reason
    ("Permission denied", "Is a directory") or "not UTF-8 text"."""
    if isinstance(e, UnicodeDecodeError):
        return "not UTF-8 text"
    return e.strerror or str(e)


def differing_fields(
    old: Mapping[str, Any], new: Mapping[str, Any], keys: Iterable[str] | None = None
) -> list[str]:
    """The keys whose values differ between two settings records, in `keys` order (default:
    every key of either, sorted). A key present on one side only differs."""
    names = list(keys) if keys is not None else sorted(set(old) | set(new))
    return [k for k in names if old.get(k) != new.get(k)]


def refuse_other_settings(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    what: str,
    fix: str,
    keys: Iterable[str] | None = None,
    show: Callable[[str], str] | None = None,
) -> None:
    """Raise SettingsMismatch when `old` (what an earlier run recorded) and `new` (this run's
    settings) differ in any of `keys` (default: all): "`what` was made with other settings
    (a: 1 -> 2; b: ...); `fix`". `show(key)` names a field in the message (default: the key)."""
    diffs = differing_fields(old, new, keys)
    if diffs:
        name = show or (lambda k: k)
        changes = "; ".join(f"{name(k)}: {old.get(k)!r} -> {new.get(k)!r}" for k in diffs)
        raise SettingsMismatch(f"{what} was made with other settings ({changes}); {fix}")
