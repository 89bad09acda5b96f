"""Certificates for TLS tests (see :mod:`bench.harness.pki`), and the mark that skips without the openssl CLI."""

from __future__ import annotations

import shutil

import pytest

from bench.harness.pki import issue, make_ca

__all__ = ["issue", "make_ca", "requires_openssl"]

requires_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl CLI to make certificates"
)
