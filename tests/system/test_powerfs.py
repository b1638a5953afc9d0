"""The power-loss file system itself (tests/system/powerfs.py): a cut keeps exactly what was synced."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.powermounts import PowerMount, fuse_missing


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[PowerMount]:
    missing = fuse_missing()
    assert not missing, f"powerfs needs FUSE (.ci/run installs fuse3 and mfusepy): {missing}"
    m = PowerMount(tmp_path)
    m.up()
    try:
        yield m
    finally:
        m.down()


def write(path: Path, data: bytes, *, offset: int | None = None, flags: int = 0, sync: bool = False) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    try:
        if offset is None:
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_a_cut_keeps_what_was_synced_and_nothing_else(mount: PowerMount) -> None:
    m = mount.mount
    (m / "dir").mkdir()
    log = m / "dir" / "log"
    write(log, b"synced ", sync=True)
    write(log, b"lost")  # appended, never synced
    write(log, b"S", offset=0)  # an overwrite of synced bytes, never synced
    never = m / "dir" / "never"
    write(never, b"never synced")
    cut = m / "cut"
    write(cut, b"x" * 10_000, sync=True)
    os.truncate(cut, 10)  # a truncate of synced bytes, never synced
    write(cut, b"yy", offset=50)
    moved = m / "moved"
    write(m / "before", b"a", sync=True)
    write(m / "before", b"b")
    os.rename(m / "before", moved)  # its unsynced write goes with it
    dsync = m / "dsync"
    write(dsync, b"on disk on return", flags=os.O_DSYNC)
    assert log.read_bytes() == b"Synced lost"

    assert mount.cut_power()[0] == 4  # files with unsynced writes: log, never, cut, moved
    with pytest.raises(OSError) as gone:
        log.read_bytes()
    assert gone.value.errno == errno.EIO
    mount.down()

    disk = mount.backing
    assert (disk / "dir" / "log").read_bytes() == b"synced "
    assert (disk / "dir" / "never").read_bytes() == b""  # created, kept (namespace), but empty
    assert (disk / "cut").read_bytes() == b"x" * 10_000
    assert (disk / "moved").read_bytes() == b"a"
    assert (disk / "dsync").read_bytes() == b"on disk on return"
