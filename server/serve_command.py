"""``fedper serve``: start the aggregation server (uvicorn) on a data directory."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, TextIO

from fedper.common.config_cli import add_command, from_arguments
from fedper.server.config import ServerConfig

if TYPE_CHECKING:
    from fedper.server.state import ServerState


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "serve", serve, [ServerConfig],
        help="serve the aggregation endpoint that devices talk to",
        description="Run federated rounds over HTTP (PROTOCOL.md v1): devices enroll, fetch "
        "tasks, download the base, upload base updates; the server aggregates with FedAvg behind "
        "robust defaults (clipping, a weight cap; docs/SERVER.md). "
        "Secrets come from FEDPER_ADMIN_TOKEN / FEDPER_ENROLLMENT_KEY, or are generated at first "
        "start into the data directory (mode 0600) and printed once. Restarting on the same "
        "--data-dir resumes the run. Every option can also be set in the environment, as FEDPER_<OPTION> "
        "(FEDPER_ROUNDS=100, FEDPER_CLIP_FACTOR=0); a flag wins.",
        env_prefix="FEDPER_",
    )  # fmt: skip


def announce(config: ServerConfig, state: ServerState, out: TextIO) -> None:
    """What the operator is told at start: each secret generated now (once: it is stored, mode
    0600), where the server listens and where the run stands."""
    for name in state.secrets.generated:
        value = state.secrets.admin_token if name == "admin_token" else state.secrets.enrollment_key
        print(f"generated {name} (stored in {config.data_dir / name}, shown once): {value}", file=out)
    snap = state.rounds.snapshot
    print(
        f"serving {config.artifacts} on http://{config.host}:{config.port} (round {snap.round}, "
        f"model version {snap.model_version}, {'finished' if snap.finished else 'running'}); "
        f"dashboard at http://{config.host}:{config.port}/dashboard (log in with the admin token, any user "
        f"name); metrics at /metrics; OpenAPI at /docs",
        file=out,
        flush=True,
    )


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from fedper.server.app import create_app
    from fedper.server.http_protocol import protocol_class
    from fedper.server.log_throttle import throttle_root_handlers
    from fedper.server.malloc_arenas import limit_malloc_arenas
    from fedper.server.state import open_state

    config = from_arguments(ServerConfig, args)
    limit_malloc_arenas()  # before any worker thread allocates
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    throttle_root_handlers()
    state = open_state(config)  # a StartupError (a FedperError) is printed by the command line
    announce(config, state, sys.stderr)
    trusted = config.trusted_proxies
    uvicorn.run(
        create_app(config, state),
        host=config.host,
        port=config.port,
        log_level="warning",
        log_config=None,  # uvicorn's records go to the root handler, throttled like ours
        http=protocol_class(config.header_timeout),
        proxy_headers=bool(trusted),  # uvicorn would otherwise trust X-Forwarded-For from 127.0.0.1
        forwarded_allow_ips=trusted or None,
        timeout_keep_alive=config.keep_alive_timeout,
    )
    return 0
