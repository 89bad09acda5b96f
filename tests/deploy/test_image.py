"""The container image builds here and serves kvpoolctl (slow; set KVPOOL_TEST_IMAGE=1 to run).

It starts a private dockerd, builds the base with debootstrap (a few minutes the
first time), then deploy/image/smoke.sh runs the image and talks to its daemon over
TCP and UCX.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(os.environ.get("KVPOOL_TEST_IMAGE") != "1", reason="set KVPOOL_TEST_IMAGE=1 to build the image"),
    pytest.mark.skipif(os.geteuid() != 0, reason="dockerd and debootstrap need root"),
]


@pytest.mark.timeout(900)
def test_image_builds_and_serves() -> None:
    env = {**os.environ, "KVPOOL_KEEP_DOCKERD": "", "KVPOOL_IMAGE_UCX": "1"}
    build = subprocess.run(
        ["bash", "deploy/image/build.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=840
    )
    assert build.returncode == 0, build.stdout + build.stderr
    smoke = subprocess.run(
        ["bash", "deploy/image/smoke.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "smoke: ok" in smoke.stdout
    # The default image carries the ucx extra: its daemon serves blocks over UCX too.
    assert "smoke: the daemon advertises ucx" in smoke.stdout
