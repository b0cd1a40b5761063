"""The resumable output of `regenerate`.

Output: JSONL, one whole line per finished record, `{"index", "source", "messages"}` (chat) or
`{"index", "source", "prompt", "completion"}`, appended and flushed. A re-run with the same
settings resumes: finished indices are kept and skipped, a partial last line (a crash mid-write)
is discarded. The settings (backend, sampling, template kwargs, input hash) are recorded in the
sidecar `<out>.settings.json`; a re-run with other settings is refused, never mixed in.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specdraft.data.records import Records
from specdraft.files import atomic_write_json, differing_fields
from specdraft.regenerate.backends import RegenerationError


def settings_path(out_path: Path) -> Path:
    """The sidecar of an output file: `<out>.settings.json` (backend, sampling, input hash)."""
    return out_path.with_name(out_path.name + ".settings.json")


def check_out_path(out_path: str | Path, data: str | Path | None = None) -> Path:
    """`out_path` as a Path; RegenerationError when it is a directory (OUT is a JSONL file) or the
    input file `data` itself (resuming would read it as an output of other settings)."""
    out_path = Path(out_path)
    if data is not None and out_path.resolve() == Path(data).resolve():
        raise RegenerationError(f"OUT is the input file DATA ({data}): give a new output path")
    if out_path.is_dir():
        raise RegenerationError(
            f"{out_path} is a directory; OUT must be a JSONL file path, e.g. "
            f"{out_path / 'regenerated.jsonl'}"
        )
    return out_path


def interrupted_regenerate(out_path: str | Path) -> str:
    """What an interrupted regenerate into `out_path` kept, for the line the CLI prints."""
    out_path = Path(out_path)
    try:
        total = json.loads(settings_path(out_path).read_text())["num_records"]
        kept = len(finished_indices(out_path))
    except (OSError, ValueError, KeyError, TypeError):
        return "no record written yet: re-run the same command to start"
    return f"{kept} of {total} records kept in {out_path}: re-run the same command to continue"


def check_settings(out_path: Path, settings: dict) -> None:
    """Write the sidecar, or compare with the one an earlier run wrote. Raises
    RegenerationError for an output without its sidecar, a sidecar that cannot be read, or one
    written with other settings."""
    sidecar = settings_path(out_path)
    if out_path.exists() and not sidecar.exists():
        raise RegenerationError(
            f"{out_path} exists without its settings file {sidecar.name}; "
            f"use a new output path or delete it"
        )
    if sidecar.exists() and out_path.exists():
        try:
            old = json.loads(sidecar.read_text())
        except (OSError, ValueError) as e:
            raise RegenerationError(
                f"{sidecar}: cannot be read as JSON ({e}); use a new output path or delete "
                f"{out_path} and {sidecar.name}"
            ) from None
        diffs = differing_fields(old, settings)
        if diffs:
            raise RegenerationError(
                f"{out_path} was produced with other settings ({', '.join(diffs)} differ{'s' * (len(diffs) == 1)}; see "
                f"{sidecar}); use a new output path or delete both files"
            )
        return
    atomic_write_json(sidecar, settings)


def finished_indices(out_path: Path) -> set[int]:
    """Indices already in `out_path`; a partial last line (no newline) is cut off the file.
    Raises RegenerationError naming the line for a complete line that is not a record."""
    if not out_path.exists():
        return set()
    data = out_path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(out_path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
        data = data[: data.rfind(b"\n") + 1]
    done = set()
    for line_no, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError) as e:
            raise RegenerationError(
                f"{out_path}:{line_no}: not a regenerated record ({e}); delete the line or the file"
            ) from e
    return done


def records_hash(records: Records) -> str:
    """sha256 (hex) of the records' contents, in order: the sidecar's `input_hash`."""
    h = hashlib.sha256()
    for r in records.records:
        h.update(
            json.dumps([r.messages, r.prompt, r.text, *([r.tools] if r.tools else [])]).encode(
                "utf-8"
            )
            + b"\n"
        )
    return h.hexdigest()
