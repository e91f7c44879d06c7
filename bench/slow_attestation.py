"""The attestation verifier of ``bench.enrollment_flood``: a verification service that takes
``FEDPER_BENCH_VERIFIER_SECONDS`` (5 by default) for every token, then accepts
``genuine-<platform>-<nonce>`` (a genuine install's token binds the server's nonce) and refuses
every other, as a Play Integrity verifier refuses a forged token, only slowly."""

from __future__ import annotations

import os
import time


def verify(token: str, platform: str | None, nonce: str) -> str | None:
    time.sleep(float(os.environ.get("FEDPER_BENCH_VERIFIER_SECONDS", "5")))
    return None if token == f"genuine-{platform}-{nonce}" else "not a genuine install's token for this nonce"
