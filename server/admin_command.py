"""``fedper admin``: the operator's calls to a running server (admin token), from a shell.

``fedper admin rollback --to N`` reopens the run from model version N (PROTOCOL.md, revision
1.4); ``fedper admin stop`` finishes it. The token comes from FEDPER_ADMIN_TOKEN or from
``--data-dir``'s admin_token file (where the server keeps a generated one).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from fedper.common.config_cli import add_command, from_arguments, option
from fedper.common.errors import FedperError
from fedper.common.protocol import Env, Header, RolledBack, Route, Stopped


@dataclass(frozen=True)
class AdminConfig:
    server: str = option("http://127.0.0.1:8000", "the server's base URL")
    data_dir: Path = option(
        Path("server-data"), f"the server's data directory, for its admin_token file (unless {Env.ADMIN_TOKEN} is set)",
        metavar="DIR",
    )  # fmt: skip
    timeout: float = option(60.0, "seconds to wait for the server's answer")


@dataclass(frozen=True)
class RollbackConfig:
    to: int = option(-1, "the model version to go on from (required)", metavar="N")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    admin = sub.add_parser("admin", help="operator calls to a running server (admin token)",
                           description="Operator calls to a running `fedper serve`.")  # fmt: skip
    calls = admin.add_subparsers(dest="call", metavar="CALL", required=True)
    add_command(
        calls, "rollback", rollback, [AdminConfig, RollbackConfig],
        help="reopen the run from model version N",
        description="Abandon the open round and go on from model version N: its tensors are published "
        "again as a new version, which the next round trains (docs/SERVER.md, Rollback).",
    )  # fmt: skip
    add_command(calls, "stop", stop, [AdminConfig], help="finish the run now",
                description="Finish the run: the open round is recorded as stopped, not aggregated.")  # fmt: skip


def _token(config: AdminConfig) -> str:
    token = os.environ.get(Env.ADMIN_TOKEN)
    if token:
        return token
    path = config.data_dir / "admin_token"
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise FedperError(f"no admin token: set {Env.ADMIN_TOKEN} or point --data-dir at the server's ({exc})") from exc


def _post(config: AdminConfig, path: str) -> dict[str, object]:
    import httpx

    url = config.server.rstrip("/") + path
    try:
        r = httpx.post(url, headers={Header.AUTHORIZATION: f"Bearer {_token(config)}"}, timeout=config.timeout)
    except httpx.HTTPError as exc:
        raise FedperError(f"cannot reach {url}: {exc}") from exc
    if r.status_code != 200:
        raise FedperError(f"{url} answered {r.status_code}: {r.text[:300]}")
    body: dict[str, object] = r.json()
    return body


def rollback(args: argparse.Namespace) -> int:
    config, target = from_arguments(AdminConfig, args), from_arguments(RollbackConfig, args)
    if target.to < 0:
        raise FedperError("--to N is required: the model version to go on from (>= 0)")
    done = RolledBack.model_validate(_post(config, Route.ADMIN_ROLLBACK.format(version=target.to)))
    print(f"rolled back to version {done.rolled_back_to}: round {done.round} trains version {done.model_version} "
          f"(a copy of it)", file=sys.stderr)  # fmt: skip
    return 0


def stop(args: argparse.Namespace) -> int:
    Stopped.model_validate(_post(from_arguments(AdminConfig, args), Route.ADMIN_STOP))
    print("the run is finished", file=sys.stderr)
    return 0
