"""Throwaway certificates made by the openssl CLI: a CA, and leaf certificates for 127.0.0.1.

Used by the TLS benchmark and the TLS tests; nothing here is fit for production keys.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        str(key),
        "-out",
        str(cert),
    )
    return cert, key


def issue(directory: Path, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by ``ca``."""
    cert, key, request = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
    extensions = directory / f"{name}.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(request))
    openssl(
        "x509",
        "-req",
        "-in",
        str(request),
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(extensions),
        "-out",
        str(cert),
    )
    return cert, key
