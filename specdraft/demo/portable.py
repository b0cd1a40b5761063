"""report.md without this machine's paths: the demo's folder (--out, as given or resolved) is
written relative to the report, which lies in it, and a target outside it as `$TARGET`, so a
report copied to a GPU host, with its folder, still runs there."""

from __future__ import annotations

import re
from pathlib import Path

TARGET_PLACEHOLDER = "$TARGET"


def portable_paths(text: str, out: Path, target: Path | None) -> str:
    """`text` with every path under `out` (as given or resolved) relative to `out` ("./target",
    "./export/vllm"; `out` itself: "."), and `target`, when it lies outside `out`, replaced by
    TARGET_PLACEHOLDER. A path is matched whole: it starts where no path character precedes
    it and ends at a "/" or a character that cannot continue its last name (a "." that ends a
    sentence ends it)."""
    replacements = {}
    if target is not None and not _inside(target, out):
        replacements.update(dict.fromkeys(_spellings(target), TARGET_PLACEHOLDER))
    replacements.update(dict.fromkeys(_spellings(out), "."))
    for spelled in sorted(replacements, key=len, reverse=True):
        pattern = rf"(?<![\w./~$-]){re.escape(spelled)}(/|(?![\w-]|\.\w))"
        # "./" + the rest for a path under the report's folder ("./export/vllm")
        text = re.sub(pattern, lambda m, s=spelled: replacements[s] + m.group(1), text)
    return text


def target_line(out: Path, target: Path | None) -> list[str]:
    """The one line saying what to set when the report names `$TARGET` (a target outside --out);
    none otherwise."""
    if target is None or _inside(target, out):
        return []
    return [
        "Set `TARGET` to the target's directory on the machine that runs these "
        "(`export TARGET=...`: the model the demo's --target named)."
    ]


def _spellings(path: Path) -> list[str]:
    """`path` as given and resolved ("." and "" left out: they are no path to find in a text)."""
    spelled = (str(path).rstrip("/"), str(path.resolve()))
    return [s for s in dict.fromkeys(spelled) if s not in ("", ".")]


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())
