"""Device attestation at enrollment (PROTOCOL.md, revision 1.4): the operator's verifier.

The enrollment key ships inside every copy of the app, so anyone can enroll as many devices
as the rate limits allow. What ties an enrollment to a genuine install on a genuine phone is
the platform's attestation: on Android, a Play Integrity token that the app requests with a
nonce and the server has Google decode (``decodeIntegrityToken``, with the operator's cloud
credentials). The server cannot ship those credentials, so verification is a hook:
``--attestation package.module:function``, a function ``(token, platform) -> str | None``
that returns why a token is refused, or None to accept it. With a verifier configured, an
enrollment without a token or with a refused one gets ``403 attestation_failed``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from fedper.common.errors import ConfigError

Verifier = Callable[[str | None, str | None], str | None]  # (token, platform) -> why refused, or None


def load_verifier(spec: str) -> Verifier | None:
    """The function named ``module:function``, or None for an empty spec."""
    if not spec:
        return None
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(f"--attestation must be module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--attestation: cannot import {module_name!r}: {exc}") from exc
    verifier = getattr(module, name, None)
    if not callable(verifier):
        raise ConfigError(f"--attestation: {module_name!r} has no function {name!r}")
    found: Verifier = verifier
    return found
