"""Where a device gets its enrollment key: the environment or a file, never the command line
(where ``ps`` would show it)."""

from __future__ import annotations

import os
from pathlib import Path

from fedper.common.errors import FedperError
from fedper.common.protocol import Env


class MissingEnrollmentKeyError(FedperError, ValueError):
    pass


def enrollment_key(key_file: Path | None) -> str:
    if key_file is not None:
        try:
            key = Path(key_file).read_text().strip()
        except OSError as exc:
            raise MissingEnrollmentKeyError(f"cannot read the enrollment key file {key_file}: {exc.strerror}") from exc
        if not key:
            raise MissingEnrollmentKeyError(f"{key_file} is empty")
        return key
    key = os.environ.get(Env.ENROLLMENT_KEY, "").strip()
    if not key:
        raise MissingEnrollmentKeyError(
            f"no enrollment key: set {Env.ENROLLMENT_KEY} or pass --enrollment-key-file FILE "
            "(the server prints it at first start and keeps it in its data directory)"
        )
    return key
