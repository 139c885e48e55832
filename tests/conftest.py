"""Fixtures shared by the test files: the toy SFT checkpoint every test starts from."""

import os
from pathlib import Path

import pytest

import toy_task

SFT_STEPS = 0  # the recipe's checkpoint of the default task, shipped in checkpoints/: nothing to train


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """The cache folder the tests' runs use. The default task's SFT checkpoint is shipped, so the
    folder stays empty unless a test asks for another setting. PRIME_TEST_CACHE=DIR keeps it between
    sessions while developing; CI starts from nothing."""
    cache = Path(os.environ["PRIME_TEST_CACHE"]) if os.environ.get("PRIME_TEST_CACHE") else \
        tmp_path_factory.mktemp("cache")
    toy_task.sft_checkpoint(cache, SFT_STEPS)
    return cache
