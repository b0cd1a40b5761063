"""specdraft.files: atomic writes leave ordinary file modes, whatever mode the writer used."""

from __future__ import annotations

import os
import stat

import pytest

from specdraft.files import atomic_dir, atomic_write


def _owner_only(path):
    # what safetensors' save_file and save_pretrained do: create the file 0600
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, b"x")
    os.close(fd)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield 0o640
    os.umask(previous)


def test_atomic_write_gives_the_umask_mode(tmp_path, umask_027):
    path = atomic_write(tmp_path / "weights.bin", _owner_only)
    assert path.read_bytes() == b"x" and _mode(path) == umask_027


def test_atomic_dir_gives_every_file_the_umask_mode(tmp_path, umask_027):
    with atomic_dir(tmp_path / "out") as staging:
        (staging / "sub").mkdir()
        _owner_only(staging / "model.safetensors")
        _owner_only(staging / "sub" / "shard.bin")
    out = tmp_path / "out"
    assert _mode(out / "model.safetensors") == _mode(out / "sub" / "shard.bin") == umask_027
