"""``fedper admin watch``: a running server's rounds, refusals and privacy in a terminal, for an
operator reached over SSH. It reads what any operator can: ``/v1/status``, ``/metrics`` and the
last rounds' ``/v1/rounds/{r}`` (admin token), every ``--interval`` seconds."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fedper.common.errors import FedperError
from fedper.common.protocol import Header, RoundInfo, Route, Status
from fedper.server.metrics_registry import METRICS_PATH


@dataclass(frozen=True)
class RunView:
    """One look at the run: its status, its last rounds (oldest first) and what /metrics counts."""

    status: Status
    rounds: list[RoundInfo]
    refusals: dict[str, float]  # updates refused, by error code
    answers: dict[str, float]  # requests, by answer class
    bytes_in: float
    bytes_out: float


def fetch(http: httpx.Client, token: str, last: int) -> RunView:
    """The run as the server says it now; FedperError when it cannot be reached or refuses."""
    try:
        status = Status.model_validate_json(_get(http, Route.STATUS).content)
        auth = {Header.AUTHORIZATION: f"Bearer {token}"}
        numbers = range(max(1, status.round - last + 1), status.round + 1)
        rounds = [RoundInfo.model_validate_json(_get(http, Route.ROUND.format(round_number=n), auth).content)
                  for n in numbers]  # fmt: skip
        text = _get(http, METRICS_PATH).text
    except httpx.HTTPError as exc:
        raise FedperError(f"cannot reach {http.base_url}: {exc}") from exc
    refusals: dict[str, float] = {}
    answers: dict[str, float] = {}
    totals = {"fedper_bytes_received_total": 0.0, "fedper_bytes_sent_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fedper_updates_rejected_total":
                refusals[sample.labels["code"]] = sample.value
            elif sample.name == "fedper_request_duration_seconds_count":
                answers[sample.labels["answer"]] = answers.get(sample.labels["answer"], 0.0) + sample.value
            elif sample.name in totals:
                totals[sample.name] = sample.value
    return RunView(status, rounds, refusals, answers, totals["fedper_bytes_received_total"],
                   totals["fedper_bytes_sent_total"])  # fmt: skip


def _get(http: httpx.Client, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    r = http.get(path, headers=headers)
    if r.status_code != 200:
        raise FedperError(f"{http.base_url}{path} answered {r.status_code}: {r.text[:200]}")
    return r


def render(view: RunView) -> Group:
    """The view as rich renderables: a status line, the rounds, refusals and answers."""
    s = view.status
    line = Text.assemble(
        (f"{s.state}", "bold green" if s.state == "running" else "bold"),
        f"  round {s.round} of {s.rounds_total}, {s.rounds_closed} closed, model version {s.model_version}, ",
        f"{s.devices} devices",
        (" DRAINING (disk full)", "bold red") if s.draining else "",
    )
    parts: list[object] = [line]
    if s.privacy is not None:
        eps = "infinite (no noise)" if s.privacy.epsilon is None else f"{s.privacy.epsilon:.3g}"
        target = "" if s.privacy.target_epsilon is None else f" of {s.privacy.target_epsilon:.3g}"
        parts.append(Text(f"DP: epsilon {eps}{target} at delta {s.privacy.delta:g} after {s.privacy.rounds} noised "
                          f"rounds; clip {s.privacy.clip_norm:.4g}"))  # fmt: skip
    rounds = Table(title="rounds", title_justify="left")
    for column in ("round", "state", "version", "received", "accuracy (mean +- std, n)", "reason"):
        rounds.add_column(column)
    for r in view.rounds:
        acc = r.metrics.get("accuracy")
        accuracy = f"{acc.mean:.3f} +- {acc.std:.3f}, {acc.count}" if acc is not None else ""
        style = {"open": "cyan", "closed": "green", "abandoned": "red"}.get(r.state, "")
        rounds.add_row(str(r.round), Text(r.state, style=style), str(r.model_version),
                       f"{r.received}/{r.target_clients}", accuracy, (r.reason or "")[:60])  # fmt: skip
    parts.append(rounds)
    refused = Table(title="refused updates, by code", title_justify="left")
    refused.add_column("code")
    refused.add_column("count", justify="right")
    for code, n in sorted(view.refusals.items(), key=lambda kv: -kv[1]):
        refused.add_row(code, f"{n:.0f}")
    parts.append(refused)
    answers = ", ".join(f"{k} {v:.0f}" for k, v in sorted(view.answers.items()))
    parts.append(Text(f"requests: {answers or 'none yet'}; bytes in {view.bytes_in:.3g}, out {view.bytes_out:.3g}"))
    return Group(*parts)  # type: ignore[arg-type]


def watch(server: str, token: str, last: int, interval: float, once: bool, console: Console) -> None:
    """Draws the view, again every ``interval`` seconds until interrupted (``once``: one frame)."""
    with httpx.Client(base_url=server.rstrip("/"), timeout=30) as http:
        if once:
            console.print(render(fetch(http, token, last)))
            return
        with Live(render(fetch(http, token, last)), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                try:
                    live.update(render(fetch(http, token, last)))
                except FedperError as exc:  # keep watching through a restart
                    live.update(Text(f"{exc}; trying again every {interval:g} s", style="red"))
