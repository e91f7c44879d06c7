"""The operator's live dashboard (docs/SERVER.md, "Monitoring"): one static page, and the JSON it
polls. Both need the admin token (HTTP Basic: a browser asks for it). The page loads nothing from
anywhere else; its Content-Security-Policy lets it run only its own inline script and style and
fetch only from this server."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from anyio import to_thread
from fastapi import APIRouter, Response
from fastapi.responses import HTMLResponse

from fedper.common.protocol import Header
from fedper.server.auth import BrowserOperator, State
from fedper.server.dashboard_data import DASHBOARD_DATA_PATH, DASHBOARD_PATH, DashboardData
from fedper.server.dashboard_view import collect
from fedper.server.routes.responses import ERRORS

router = APIRouter()
_PAGE = resources.files("fedper.server").joinpath("dashboard.html").read_text(encoding="utf-8")


def _hashes(tag: str) -> str:
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", _PAGE, flags=re.DOTALL)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)


_POLICY = (
    f"default-src 'none'; script-src {_hashes('script')}; style-src {_hashes('style')}; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {"Content-Security-Policy": _POLICY, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer"}  # fmt: skip


@router.get(DASHBOARD_PATH, response_class=HTMLResponse, responses=ERRORS, include_in_schema=False)
def dashboard(_op: BrowserOperator) -> Response:
    return HTMLResponse(_PAGE, headers=_HEADERS)


@router.get(DASHBOARD_DATA_PATH, response_model=DashboardData, responses=ERRORS, include_in_schema=False)
async def dashboard_data(_op: BrowserOperator, state: State) -> Response:
    data = await to_thread.run_sync(collect, state)
    return Response(data.model_dump_json(), media_type=Header.JSON, headers={"Cache-Control": "no-store"})
