"""Test doubles of an attestation verifier (server/attestation.py). ``verify`` accepts the token
``genuine-<platform>-<nonce>`` (a genuine install's token binds the server's nonce, as Play
Integrity's and App Attest's do) and refuses every other, as a Play Integrity verifier refuses a
token from an emulator or a modified app. ``forgetful`` forgets the no-token case (issue 50's
finding: it let token-less enrollment through), ``slow`` waits for ``RELEASE`` (a verification
service that hangs), ``sluggish`` takes ``SLUGGISH`` seconds and records the order it answered
in, ``legacy`` has revision 1.4's two arguments."""

from __future__ import annotations

import threading
import time

RELEASE = threading.Event()
CALLS: list[str] = []
SLUGGISH = 0.2
ANSWERED: list[str] = []  # sluggish's tokens, in the order it answered them


def verify(token: str, platform: str | None, nonce: str) -> str | None:
    if token != f"genuine-{platform}-{nonce}":
        return "the token does not attest a genuine install, or not for this nonce"
    return None


def forgetful(token: str | None, platform: str | None, nonce: str) -> str | None:
    return None if token is None else verify(token, platform, nonce)


def slow(token: str, platform: str | None, nonce: str) -> str | None:
    CALLS.append(threading.current_thread().name)
    RELEASE.wait(30)
    return verify(token, platform, nonce)


def sluggish(token: str, platform: str | None, nonce: str) -> str | None:
    time.sleep(SLUGGISH)
    ANSWERED.append(token)
    return verify(token, platform, nonce)


def legacy(token: str | None, platform: str | None) -> str | None:
    return None
