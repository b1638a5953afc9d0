"""A FUSE file system that loses what was not fsynced when the power goes (for the power-loss test).

``python -m tests.system.powerfs BACKING MOUNT CONTROL_SOCKET`` mounts ``BACKING`` at ``MOUNT``
(libfuse3 through the ``mfusepy`` binding) and passes every operation through to it, keeping, per
file, what it needs to undo the writes since the file's last ``fsync``/``fdatasync``: its size then
and the bytes each later write or truncate overwrote (a write through a descriptor opened
``O_SYNC``/``O_DSYNC`` counts as synced on return, like a write and an fsync). A client of
``CONTROL_SOCKET`` that sends ``drop`` cuts the power: every file goes back to its content at its
last sync (a file created since and never synced ends up empty), and every later operation fails
with EIO, as on a disk that is gone; ``list`` names the files with unsynced writes. The test then
unmounts it and mounts the same backing directory again for the "reboot".

What it models: the page cache of a machine whose power fails — file data reach the disk only
through an fsync (what Jepsen's lazyfs calls losing unfsynced writes). What it does not: namespace
operations (create, rename, unlink, mkdir) are kept as if the file system journaled them at once,
and a sync's effect on other files or the directory is not modelled; torn writes and bit rot are
not simulated either. Reads see the latest data, as from a page cache.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import mfusepy as fuse  # type: ignore[import-untyped]


@dataclass
class Unsynced:
    """What undoes one file's writes since its last sync: its size then, and each overwritten range."""

    size: int
    overwritten: list[tuple[int, bytes]] = field(default_factory=list)


class PowerFS(fuse.Operations):  # type: ignore[misc]  # mfusepy ships no type hints for its base class
    use_ns = True  # utimens gets nanoseconds

    def __init__(self, root: str) -> None:
        self.root = root
        self._mutex = threading.Lock()  # not "lock": that name is the FUSE lock operation
        self.unsynced: dict[str, Unsynced] = {}
        self.sync_fds: set[int] = set()  # opened O_SYNC / O_DSYNC: each write is synced on return
        self.powered = True

    # --- bookkeeping

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _check(self) -> None:
        if not self.powered:
            raise fuse.FuseOSError(errno.EIO)

    def _track(self, path: str, size: int) -> Unsynced:
        u = self.unsynced.get(path)
        if u is None:
            u = self.unsynced[path] = Unsynced(size)
        return u

    def _save(self, path: str, fd: int, offset: int, end: int) -> None:
        """Keep the bytes in [offset, end) that belong to the last synced content (later ones are cut)."""
        u = self._track(path, os.fstat(fd).st_size)
        end = min(end, u.size)
        if end > offset:
            old = os.pread(fd, end - offset, offset)
            if old:
                u.overwritten.append((offset, old))

    def drop_unsynced(self) -> tuple[int, int]:
        """The power cut: every file back to its last synced content. Returns (files, bytes dropped)."""
        with self._mutex:
            self.powered = False
            files = dropped = 0
            for path, u in self.unsynced.items():
                real = self._real(path)
                try:
                    fd = os.open(real, os.O_RDWR)
                except FileNotFoundError:
                    continue
                try:
                    dropped += max(0, os.fstat(fd).st_size - u.size)
                    for offset, old in reversed(u.overwritten):
                        os.pwrite(fd, old, offset)
                        dropped += len(old)
                    os.ftruncate(fd, u.size)
                finally:
                    os.close(fd)
                files += 1
            self.unsynced.clear()
            return files, dropped

    def unsynced_paths(self) -> list[str]:
        with self._mutex:
            return sorted(self.unsynced)

    # --- files

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self._check()
        st = os.lstat(self._real(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")
        return {k: getattr(st, k) for k in keys}

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            self._check()
            real = self._real(path)
            if flags & os.O_TRUNC:
                self._truncate_locked(path, 0)
            # The kernel passes each write's offset, O_APPEND included: pwrite must not append instead.
            fd = os.open(real, flags & ~(os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL))
            self._note_sync_flags(fd, flags)
            return fd

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self._mutex:
            self._check()
            fd = os.open(self._real(path), os.O_RDWR | os.O_CREAT, mode)
            self._track(path, os.fstat(fd).st_size)  # a new file: empty until synced
            self._note_sync_flags(fd, flags)
            return fd

    def _note_sync_flags(self, fd: int, flags: int) -> None:
        if flags & (os.O_SYNC | os.O_DSYNC):
            self.sync_fds.add(fd)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._check()
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            self._check()
            if fh in self.sync_fds:  # a synchronous write: the file is synced on return, as by an fsync
                self.unsynced.pop(path, None)
                return os.pwrite(fh, data, offset)
            self._save(path, fh, offset, offset + len(data))
            return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._mutex:
            self._check()
            self._truncate_locked(path, length)
        return 0

    def _truncate_locked(self, path: str, length: int) -> None:
        fd = os.open(self._real(path), os.O_RDWR)
        try:
            self._save(path, fd, length, os.fstat(fd).st_size)
            os.ftruncate(fd, length)
        finally:
            os.close(fd)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            self._check()
            self.unsynced.pop(path, None)  # on the (simulated) disk now
        return 0

    def flush(self, path: str, fh: int) -> int:
        self._check()
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            self.sync_fds.discard(fh)
        os.close(fh)
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            self._check()
            os.unlink(self._real(path))
            self.unsynced.pop(path, None)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            self._check()
            os.rename(self._real(old), self._real(new))
            moved = {p: u for p, u in self.unsynced.items() if p == old or p.startswith(old + "/")}
            for p in list(self.unsynced):
                if p == new or p.startswith(new + "/") or p in moved:
                    del self.unsynced[p]
            for p, u in moved.items():
                self.unsynced[new + p[len(old) :]] = u
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._check()
        os.chmod(self._real(path), mode)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._check()
        if times is None:
            os.utime(self._real(path))
        else:
            os.utime(self._real(path), ns=times)
        return 0

    # --- directories

    def mkdir(self, path: str, mode: int) -> int:
        self._check()
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self._check()
        os.rmdir(self._real(path))
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        self._check()
        return [".", "..", *os.listdir(self._real(path))]

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._check()
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_frsize")
        return {k: getattr(st, k) for k in keys} | {"f_namemax": st.f_namemax}


def serve_control(fs: PowerFS, sock_path: str) -> None:
    """Answer ``drop`` on the control socket with ``dropped FILES BYTES``, ``list`` with the files
    that have unsynced writes, one a line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(sock_path)
        srv.listen(4)
        while True:
            conn, _ = srv.accept()
            with conn:
                command = conn.recv(64).strip()
                if command == b"drop":
                    files, dropped = fs.drop_unsynced()
                    conn.sendall(f"dropped {files} {dropped}\n".encode())
                elif command == b"list":
                    conn.sendall("".join(f"{p}\n" for p in fs.unsynced_paths()).encode() or b"\n")


def main(argv: list[str]) -> None:
    backing, mount, control = argv
    fs = PowerFS(backing)
    threading.Thread(target=serve_control, args=(fs, control), daemon=True).start()
    # Single-threaded: the operations are serialized anyway (one lock keeps the undo records exact).
    fuse.FUSE(fs, mount, foreground=True, nothreads=True, fsname="powerfs")


if __name__ == "__main__":
    main(sys.argv[1:])
