"""Shared by the tests that attack or kill real local (bubblewrap) sandboxes as host root."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def root_bwrap_problem() -> str | None:
    """Why these tests cannot run here (bubblewrap missing, or not host root for uid separation), or None."""
    if shutil.which("bwrap") is None:
        return "bubblewrap not installed (apt-get install -y bubblewrap)"
    if os.geteuid() != 0:
        return "uid separation of local sandboxes needs the host side to run as root"
    return None


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agrl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
