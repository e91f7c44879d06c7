"""A test double of an attestation verifier (server/attestation.py): accepts the token
``genuine-<platform>``, refuses every other, as a Play Integrity verifier refuses a token from
an emulator or a modified app."""

from __future__ import annotations


def verify(token: str | None, platform: str | None) -> str | None:
    if token is None:
        return "no attestation token"
    if token != f"genuine-{platform}":
        return "the token does not attest a genuine install"
    return None
