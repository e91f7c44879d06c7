"""Secrets and tokens: generated, stored hashed, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from fedper.common.atomic_write import atomic_write_text
from fedper.common.protocol import Env

ADMIN_TOKEN_FILE = "admin_token"
ENROLLMENT_KEY_FILE = "enrollment_key"


def new_token() -> str:
    """256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """Tokens are random and long, so one SHA-256 is enough (no password stretching)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


@dataclass(frozen=True)
class Secrets:
    admin_token: str
    enrollment_key: str
    generated: tuple[str, ...]  # which were generated at this start (printed once)


def load_or_create(data_dir: Path) -> Secrets:
    """From the environment, else from the data directory, else generated and stored (0600)."""
    generated = []
    values = {}
    for env, filename in (
        (Env.ADMIN_TOKEN, ADMIN_TOKEN_FILE),
        (Env.ENROLLMENT_KEY, ENROLLMENT_KEY_FILE),
    ):
        path = data_dir / filename
        value = os.environ.get(env, "").strip()
        if not value and path.exists():
            value = path.read_text().strip()
        if not value:
            value = new_token()
            atomic_write_text(path, value + "\n", mode=0o600)
            generated.append(filename)
        values[filename] = value
    return Secrets(values[ADMIN_TOKEN_FILE], values[ENROLLMENT_KEY_FILE], tuple(generated))
