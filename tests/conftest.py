"""Fixtures shared by the test files: one toy SFT checkpoint for the whole session."""

import os
from pathlib import Path

import pytest

import toy_task

SFT_STEPS = 800  # a fixed-length warmup on the default task: it writes the format and solves part of the problems


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """The toy SFT checkpoint, built once per session (a few minutes on 2 cores) for every test file.
    PRIME_TEST_CACHE=DIR keeps it between sessions while developing; CI starts from nothing."""
    cache = Path(os.environ["PRIME_TEST_CACHE"]) if os.environ.get("PRIME_TEST_CACHE") else \
        tmp_path_factory.mktemp("cache")
    toy_task.sft_checkpoint(cache, SFT_STEPS)
    return cache
