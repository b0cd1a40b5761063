"""Committed assets record portable names, never the build machine's directories (issue #19):
no file under tests/assets or specdraft/assets holds an absolute path into a home, work or
temporary folder. A drafter's manifest names its target by the model's name (`pycode-25m`) and
its training command with paths relative to the repository or its work folder (`$WORK`);
tests/assets/pycode25m_draft/build.py writes them so."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ASSET_DIRS = (ROOT / "tests" / "assets", ROOT / "specdraft" / "assets")
# an absolute path into a machine's own folders: /work/..., /home/..., /tmp/..., /root/..., /Users/...
MACHINE_PATH = re.compile(rb"(?<![\w.~-])/(work|home|tmp|root|Users|scratch|mnt)/[\w.-]")


def asset_files() -> list[Path]:
    return sorted(
        p for d in ASSET_DIRS for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def test_there_are_assets_to_check():
    names = {p.name for p in asset_files()}
    assert {"specdraft_manifest.json", "stories260K.bin", "build.py"} <= names


@pytest.mark.parametrize("path", asset_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_asset_holds_no_machine_path(path):
    found = [m.group(0).decode(errors="replace") for m in MACHINE_PATH.finditer(path.read_bytes())]
    assert not found, (
        f"{path.relative_to(ROOT)} records the build machine's directories: {found[:5]}"
    )


def test_the_pycode_drafter_names_its_target_portably():
    manifest = json.loads(
        (ROOT / "tests/assets/pycode25m_draft/draft/specdraft_manifest.json").read_text()
    )
    assert manifest["target"]["name_or_path"] == "pycode-25m"
    assert "tests/assets/pycode25m_draft/train_config.json" in manifest["training_command"]


def test_the_pattern_catches_machine_paths():
    for text in (b'"/work/main/.carry/x"', b"--config /tmp/pd/run", b"/home/u/models", b"=/root/a"):
        assert MACHINE_PATH.search(text), text
    for text in (
        b"tests/assets/x",
        b"$WORK/store",
        b"/usr/include/a.h",
        b"http://host/tmp/x",
        b"a/tmp/b",
    ):
        assert not MACHINE_PATH.search(text), text


def test_build_writes_portable_names(tmp_path):
    """build.py's `make_portable` turns the build machine's directories into portable names."""
    spec = importlib.util.spec_from_file_location(
        "pycode_draft_build", ROOT / "tests/assets/pycode25m_draft/build.py"
    )
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    target, work = tmp_path / "models" / "pycode-25m", tmp_path / "work"
    config = build.REPO / "tests/assets/pycode25m_draft/train_config.json"
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "specdraft_manifest.json").write_text(
        json.dumps(
            {
                "target": {"name_or_path": str(target)},
                "training_command": f"specdraft train {work}/store {work}/run --config {config}",
                "other": [f"{work}x/kept", str(work)],
            }
        )
    )
    build.make_portable(tmp_path / "draft", target, work)
    manifest = json.loads((tmp_path / "draft" / "specdraft_manifest.json").read_text())
    assert manifest == {
        "target": {"name_or_path": "pycode-25m"},
        "training_command": "specdraft train $WORK/store $WORK/run --config "
        "tests/assets/pycode25m_draft/train_config.json",
        "other": [f"{work}x/kept", "$WORK"],
    }
