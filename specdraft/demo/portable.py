"""report.md without this machine's paths: the demo's folder (--out, as given or resolved) is
written relative to the report, which lies in it, a target outside it as `$TARGET`, and a
--chat-template outside it as its copy in the folder (`copy_chat_template`), so a report copied
to a GPU host, with its folder, still runs there."""

from __future__ import annotations

import re
from pathlib import Path

from specdraft.files import atomic_write_bytes

TARGET_PLACEHOLDER = "$TARGET"
TEMPLATE_FOLDER = "chat_template"  # under --out: the copy of a --chat-template from outside it


def template_copy(template: Path, out: Path) -> Path:
    """Where report.md finds `template` (--chat-template): the file itself when it lies under
    `out`, else its copy `out/chat_template/<its name>` (`copy_chat_template`)."""
    return template if _inside(template, out) else out / TEMPLATE_FOLDER / template.name


def copy_chat_template(template: Path | None, out: Path) -> None:
    """Copy a --chat-template that lies outside `out` to `template_copy(template, out)`, so the
    folder holds every file its report's launch lines name; nothing without one or when it
    already lies in `out`. The demo read the file before any stage (`inputs.check_inputs`)."""
    if template is not None and not _inside(template, out):
        atomic_write_bytes(template_copy(template, out), template.read_bytes())


def portable_paths(text: str, out: Path, target: Path | None, template: Path | None = None) -> str:
    """`text` with every path under `out` (as given or resolved) relative to `out` ("./target",
    "./export/vllm"; `out` itself: "."), `target`, when it lies outside `out`, replaced by
    TARGET_PLACEHOLDER, and `template` (--chat-template) by its copy in `out` (`template_copy`).
    A path is matched whole: it starts where no path character precedes it and ends at a "/" or
    a character that cannot continue its last name (a "." that ends a sentence ends it)."""
    replacements = {}
    if target is not None and not _inside(target, out):
        replacements.update(dict.fromkeys(_spellings(target), TARGET_PLACEHOLDER))
    if template is not None and not _inside(template, out):
        copy = f"./{TEMPLATE_FOLDER}/{template.name}"
        replacements.update(dict.fromkeys(_spellings(template), copy))
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
