"""``read_file`` and ``list_dir``: read-only access confined to ``LW_TOOL_ROOT``.

A path (relative to the root, or absolute inside it) is resolved with every symlink followed; the
result must lie inside the resolved root, so ``../`` escapes and symlinks that leave the root are
refused. Only regular files are read (never FIFOs or devices), at most :data:`MAX_READ_BYTES`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

import msgspec

from services.tools.sdk import ToolContext, ToolError, tool

MAX_READ_BYTES: Final = 256 * 1024
MAX_ENTRIES: Final = 1000
MAX_PATH_CHARS: Final = 4096


class PathInput(msgspec.Struct, forbid_unknown_fields=True):
    """A path relative to the tool root ("." is the root itself)."""

    path: str = "."


def confine(root_setting: str, path: str) -> tuple[Path, Path]:
    """(resolved root, resolved target inside it) or a ToolError."""
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise ToolError("invalid path")
    root = Path(root_setting or ".").resolve()
    try:
        target = (root / path).resolve(strict=True)
    except FileNotFoundError:
        raise ToolError(f"no such file or directory: {path}") from None
    except (OSError, RuntimeError) as e:  # symlink loops, permission, name too long
        raise ToolError(f"cannot resolve {path}: {e.__class__.__name__}") from None
    if target != root and not target.is_relative_to(root):
        raise ToolError(f"path escapes the tool root: {path}")
    return root, target


@tool(
    name="read_file",
    description="Read a text file under the tool root (at most 256 KiB are returned).",
    read_only=True,
)
def read_file(args: PathInput, ctx: ToolContext) -> str:
    _, target = confine(ctx.settings.tool_root, args.path)
    try:
        # O_NOFOLLOW: the resolved path has no symlinks left; refuse one swapped in since.
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ToolError(f"cannot open {args.path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"not a regular file: {args.path}")
        chunks: list[bytes] = []
        want = MAX_READ_BYTES + 1
        while want > 0 and (chunk := os.read(fd, want)):
            chunks.append(chunk)
            want -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    text = data[:MAX_READ_BYTES].decode("utf-8", "replace")
    if len(data) > MAX_READ_BYTES:
        text += f"\n[file truncated: showing the first {MAX_READ_BYTES} of {st.st_size} bytes]"
    return text


@tool(name="list_dir", description="List a directory under the tool root (directories end with '/').", read_only=True)
def list_dir(args: PathInput, ctx: ToolContext) -> str:
    root, target = confine(ctx.settings.tool_root, args.path)
    if not target.is_dir():
        raise ToolError(f"not a directory: {args.path}")
    try:
        entries = sorted(os.scandir(target), key=lambda e: e.name)
    except OSError as e:
        raise ToolError(f"cannot list {args.path}: {e.strerror}") from None
    lines = []
    for entry in entries[:MAX_ENTRIES]:
        try:
            if entry.is_dir(follow_symlinks=False):
                lines.append(entry.name + "/")
            elif entry.is_symlink():
                lines.append(entry.name + " -> (link)")
            else:
                lines.append(f"{entry.name}  {entry.stat(follow_symlinks=False).st_size} B")
        except OSError:
            lines.append(entry.name)
    if len(entries) > MAX_ENTRIES:
        lines.append(f"… and {len(entries) - MAX_ENTRIES} more")
    rel = "." if target == root else str(target.relative_to(root))
    return f"{rel}/ ({len(entries)} entries)\n" + "\n".join(lines) if lines else f"{rel}/ is empty"
