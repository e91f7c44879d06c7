"""Secrets and tokens: generated, stored hashed, compared in constant time."""

from __future__ import annotations

import base64
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
REGION_TOKENS_DIR = "region_tokens"


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


def _create_once(path: Path, value: str) -> tuple[str, bool]:
    """Store ``value`` at ``path`` unless another process sharing the directory stored its own
    first: the value that holds, and whether it is ours."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    atomic_write_text(temp, value + "\n", mode=0o600)
    try:
        os.link(temp, path)
        return value, True
    except FileExistsError:
        return path.read_text().strip(), False
    finally:
        temp.unlink(missing_ok=True)


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
            value, made = _create_once(path, new_token())
            if made:
                generated.append(filename)
        values[filename] = value
    return Secrets(values[ADMIN_TOKEN_FILE], values[ENROLLMENT_KEY_FILE], tuple(generated))


def region_token(admin_token: str, region: int) -> str:
    """Region ``region``'s token at a root: derived from the admin token (HMAC-SHA256), so that
    every replica of the root knows it without storing it, and a new admin token renews them all."""
    mac = hmac.new(admin_token.encode("utf-8"), f"fedper region token {region}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).decode("ascii").rstrip("=")


def write_region_tokens(data_dir: Path, admin_token: str, regions: int) -> dict[str, int]:
    """Each region's token in ``region_tokens/region-K`` (0600), for the operator to hand to that
    region's server; returns region by token hash, for authentication."""
    folder = data_dir / REGION_TOKENS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    by_hash = {}
    for region in range(regions):
        token = region_token(admin_token, region)
        path = folder / f"region-{region}"
        if not path.exists() or path.read_text().strip() != token:
            atomic_write_text(path, token + "\n", mode=0o600)
        by_hash[token_hash(token)] = region
    return by_hash
