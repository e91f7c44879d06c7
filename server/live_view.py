"""``fedper admin watch``: a running server's rounds, refusals and privacy in a terminal, for an
operator reached over SSH. It reads what the dashboard reads, ``/dashboard/data`` (admin token),
every ``--interval`` seconds."""

from __future__ import annotations

import time

import httpx
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fedper.common.errors import FedperError
from fedper.common.protocol import Header
from fedper.server.dashboard_data import DASHBOARD_DATA_PATH, DashboardData


def fetch(http: httpx.Client, token: str) -> DashboardData:
    """The run as the server says it now; FedperError when it cannot be reached or refuses."""
    try:
        r = http.get(DASHBOARD_DATA_PATH, headers={Header.AUTHORIZATION: f"Bearer {token}"})
    except httpx.HTTPError as exc:
        raise FedperError(f"cannot reach {http.base_url}: {exc}") from exc
    if r.status_code != 200:
        raise FedperError(f"{http.base_url}{DASHBOARD_DATA_PATH} answered {r.status_code}: {r.text[:200]}")
    try:
        return DashboardData.model_validate_json(r.content)
    except ValidationError as exc:
        raise FedperError(f"{http.base_url}{DASHBOARD_DATA_PATH} sent what this fedper cannot read: {exc}") from exc


def render(data: DashboardData, last: int) -> Group:
    """The view as rich renderables: a status line, the last ``last`` rounds, refusals and traffic."""
    run = data.run
    line = Text.assemble(
        (f"{run.state}", "bold green" if run.state == "running" else "bold"),
        f"  round {run.round} of {run.rounds_total}, {run.rounds_closed} closed, model version {run.model_version}, ",
        f"{run.devices} devices",
        (f" DRAINING ({run.draining})", "bold red") if run.draining else "",
    )
    parts: list[object] = [line]
    if run.privacy is not None:
        p = run.privacy
        eps = "infinite (no noise)" if p.epsilon is None else f"{p.epsilon:.3g}"
        target = "" if p.target_epsilon is None else f" of {p.target_epsilon:.3g}"
        parts.append(Text(f"DP: epsilon {eps}{target} at delta {p.delta:g} after {p.rounds} noised "
                          f"rounds; clip {p.clip_norm:.4g}"))  # fmt: skip
    accuracy = {v.version: v for v in data.versions if v.metric == "accuracy"}
    rounds = Table(title="rounds", title_justify="left")
    for column in ("round", "state", "version", "reported/drawn", "open for", "cohort full", "refused",
                   "accuracy (mean, p10-p90, n)", "reason"):  # fmt: skip
        rounds.add_column(column)
    for r in data.rounds[-last:]:
        acc = accuracy.get(r.model_version) if r.state != "open" else None
        shown = f"{acc.mean:.3f}, {acc.p10:.3f}-{acc.p90:.3f}, {acc.count}" if acc is not None else ""
        style = {"open": "cyan", "closed": "green", "abandoned": "red"}.get(r.state, "")
        rounds.add_row(str(r.round), Text(r.state, style=style), str(r.model_version),
                       f"{r.reported}/{'' if r.drawn is None else r.drawn}", f"{r.seconds:.1f} s",
                       "" if r.fill_seconds is None else f"{r.fill_seconds:.1f} s",
                       ", ".join(f"{c} {n}" for c, n in r.refused.items()), shown, (r.reason or "")[:60])  # fmt: skip
    parts.append(rounds)
    refused = Table(title="refused updates since the server started, by code", title_justify="left")
    refused.add_column("code")
    refused.add_column("count", justify="right")
    for code, n in sorted(data.process.refused.items(), key=lambda kv: -kv[1]):
        refused.add_row(code, str(n))
    parts.append(refused)
    answers = ", ".join(f"{k} {v}" for k, v in data.process.answers.items())
    parts.append(Text(f"requests: {answers or 'none yet'}; bytes in {data.process.bytes_in:.3g}, "
                      f"out {data.process.bytes_out:.3g}"))  # fmt: skip
    return Group(*parts)  # type: ignore[arg-type]


def watch(server: str, token: str, last: int, interval: float, once: bool, console: Console) -> None:
    """Draws the view, again every ``interval`` seconds until interrupted (``once``: one frame)."""
    with httpx.Client(base_url=server.rstrip("/"), timeout=30) as http:
        if once:
            console.print(render(fetch(http, token), last))
            return
        with Live(render(fetch(http, token), last), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                try:
                    live.update(render(fetch(http, token), last))
                except FedperError as exc:  # keep watching through a restart
                    live.update(Text(f"{exc}; trying again every {interval:g} s", style="red"))
