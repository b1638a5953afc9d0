"""A loop's shard is fixed forever once a deployment exists: pinned here for a few known ids, so a change of
the hash (or of how the id is encoded before hashing) fails a test instead of hiding existing loops."""

from __future__ import annotations

import pytest

from shared.subjects import Names

# (loop id, its shard at 1, 2, 3, 8 and 64 shards): CRC-32 (IEEE, as zlib and Ethernet) of the UTF-8 id, modulo.
KNOWN = [
    ("00000000-0000-0000-0000-000000000000", (0, 1, 1, 1, 9)),
    ("loop-a", (0, 0, 1, 2, 58)),
    ("3f2b8c1e-7d4a-4e6b-9c0f-1a2b3c4d5e6f", (0, 1, 0, 7, 63)),
    ("a" * 64, (0, 1, 2, 5, 21)),
]


@pytest.mark.parametrize(("loop_id", "shards"), KNOWN)
def test_known_loop_ids_keep_their_shards(loop_id: str, shards: tuple[int, ...]) -> None:
    assert tuple(Names(shards=n).shard_of(loop_id) for n in (1, 2, 3, 8, 64)) == shards


def test_the_hash_is_the_standard_crc32() -> None:
    # The CRC-32 check value: any client in another language computing a loop's shard must agree.
    assert Names(shards=3421780263).shard_of("123456789") == 3421780262
