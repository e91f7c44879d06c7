"""``fedper admin``: the operator's calls to a running server (admin token), from a shell.

``fedper admin rollback --to N`` reopens the run from model version N (PROTOCOL.md, "Operator
endpoints"); ``fedper admin stop`` finishes it; ``fedper admin provision --count N --out FILE``
enrolls N devices at once and writes their ids and tokens; ``fedper admin watch`` shows the run
live in a terminal. The token comes from
FEDPER_ADMIN_TOKEN or from ``--data-dir``'s admin_token file (where the server keeps a generated one).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from fedper.common.config_cli import add_command, from_arguments, option
from fedper.common.errors import FedperError
from fedper.common.protocol import MAX_PROVISION, Env, Header, Provisioned, RolledBack, Route, Stopped


@dataclass(frozen=True)
class AdminConfig:
    server: str = option("http://127.0.0.1:8000", "the server's base URL")
    data_dir: Path = option(
        Path("server-data"), f"the server's data directory, for its admin_token file (unless {Env.ADMIN_TOKEN} is set)",
        metavar="DIR",
    )  # fmt: skip
    timeout: float = option(60.0, "seconds to wait for the server's answer")


@dataclass(frozen=True)
class ProvisionConfig:
    count: int = option(0, "devices to enroll (required)", metavar="N")
    out: Path = option(Path("devices.csv"), "where their ids and tokens go (CSV, readable by its owner only)")
    platform: str = option("", "the platform recorded for them (empty: none)")


@dataclass(frozen=True)
class WatchConfig:
    last: int = option(10, "rounds shown (the newest)", metavar="N")
    interval: float = option(2.0, "seconds between looks", metavar="S")
    once: bool = option(False, "print one look and exit (for scripts and logs)")


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
    add_command(
        calls, "watch", watch, [AdminConfig, WatchConfig], help="the run's rounds, refusals and privacy, live",
        description="The run in a terminal (for a server reached over SSH): its status, its last rounds with "
        "the accuracy devices reported, updates refused by code, requests by answer, DP's epsilon and clip; "
        "drawn again every --interval seconds until Ctrl-C (docs/SERVER.md, Monitoring).",
    )  # fmt: skip
    add_command(calls, "stop", stop, [AdminConfig], help="finish the run now",
                description="Finish the run: the open round is recorded as stopped, not aggregated.")  # fmt: skip
    add_command(
        calls, "provision", provision, [AdminConfig, ProvisionConfig],
        help="enroll N devices at once and write their tokens",
        description="Enroll N devices in batches of 10,000 (POST /v1/admin/devices) and write device_id,token "
        "lines to --out, created readable by its owner only: for an operator provisioning a fleet "
        "(docs/SERVER.md, Provisioning a fleet).",
    )  # fmt: skip


def _token(config: AdminConfig) -> str:
    token = os.environ.get(Env.ADMIN_TOKEN)
    if token:
        return token
    path = config.data_dir / "admin_token"
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise FedperError(f"no admin token: set {Env.ADMIN_TOKEN} or point --data-dir at the server's ({exc})") from exc


def _post(config: AdminConfig, path: str, body: dict[str, object] | None = None, ok: int = 200) -> dict[str, object]:
    import httpx

    url = config.server.rstrip("/") + path
    try:
        r = httpx.post(url, headers={Header.AUTHORIZATION: f"Bearer {_token(config)}"}, json=body,
                       timeout=config.timeout)  # fmt: skip
    except httpx.HTTPError as exc:
        raise FedperError(f"cannot reach {url}: {exc}") from exc
    if r.status_code != ok:
        raise FedperError(f"{url} answered {r.status_code}: {r.text[:300]}")
    answer: dict[str, object] = r.json()
    return answer


def rollback(args: argparse.Namespace) -> int:
    config, target = from_arguments(AdminConfig, args), from_arguments(RollbackConfig, args)
    if target.to < 0:
        raise FedperError("--to N is required: the model version to go on from (>= 0)")
    done = RolledBack.model_validate(_post(config, Route.ADMIN_ROLLBACK.format(version=target.to)))
    print(f"rolled back to version {done.rolled_back_to}: round {done.round} trains version {done.model_version} "
          f"(a copy of it)", file=sys.stderr)  # fmt: skip
    return 0


def watch(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fedper.server.live_view import watch as live

    config, wanted = from_arguments(AdminConfig, args), from_arguments(WatchConfig, args)
    if wanted.last < 1 or not wanted.interval > 0:
        raise FedperError("--last must be >= 1 and --interval > 0")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the watch, not with a traceback
        live(config.server, _token(config), wanted.last, wanted.interval, wanted.once, Console())
    return 0


def stop(args: argparse.Namespace) -> int:
    Stopped.model_validate(_post(from_arguments(AdminConfig, args), Route.ADMIN_STOP))
    print("the run is finished", file=sys.stderr)
    return 0


def provision(args: argparse.Namespace) -> int:
    config, wanted = from_arguments(AdminConfig, args), from_arguments(ProvisionConfig, args)
    if wanted.count < 1:
        raise FedperError("--count N is required: the devices to enroll (>= 1)")
    if wanted.out.exists():
        raise FedperError(f"{wanted.out} exists: provisioning does not overwrite tokens; name another --out")
    lines = ["device_id,token"]
    left = wanted.count
    while left:
        batch = min(left, MAX_PROVISION)
        body: dict[str, object] = {"count": batch, **({"platform": wanted.platform} if wanted.platform else {})}
        done = Provisioned.model_validate(_post(config, Route.ADMIN_DEVICES, body, ok=201))
        lines += [f"{d.device_id},{d.token}" for d in done.devices]
        left -= batch
    fd = os.open(wanted.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"enrolled {wanted.count} devices; their tokens are in {wanted.out}", file=sys.stderr)
    return 0
