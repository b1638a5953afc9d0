"""The container tests: selected only by ``-m containers`` (pyproject's addopts deselects them).

They need root (apt-get, dockerd) the first time; deploy/images/build-base.sh installs and starts
what is missing and makes the base images once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.containers.stack import Stack, prepare_images, running_stack


@pytest.fixture(scope="session")
def images() -> dict[str, float]:
    took = prepare_images()
    print("image preparation (s):", {k: round(v, 1) for k, v in took.items()})
    return took


@pytest.fixture(scope="module")
def stack(images: dict[str, float]) -> Iterator[Stack]:
    with running_stack() as s:
        yield s
