"""A throw-away TLS certificate for 127.0.0.1 and localhost, made with openssl (a test that
needs one skips when openssl is missing, and fails under CI=true: tests/needs.py)."""

from __future__ import annotations

import pathlib
import subprocess

from tests import needs


def make_certificate(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``(cert.pem, key.pem)`` in ``directory``: self-signed, one day, EC P-256."""
    openssl = needs.program("openssl")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key
