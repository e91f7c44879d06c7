"""Model versions and export artifacts, as immutable files with ETags."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from fedper.common.protocol import Route
from fedper.server.auth import AnyCaller, State
from fedper.server.refusals import NotFoundError
from fedper.server.routes.responses import ERRORS, OCTETS, file_response

router = APIRouter()


@router.get(Route.MODEL_BASE, responses={200: {"content": {OCTETS: {}}}, 304: {}, **ERRORS})
def model_base(version: int, request: Request, _who: AnyCaller, state: State) -> Response:
    found = state.rounds.version_file(version)
    if found is None:
        raise NotFoundError(f"model version {version}")
    return file_response(found[0], found[1], request, state)


@router.get(Route.ARTIFACT, responses={200: {"content": {OCTETS: {}}}, 304: {}, **ERRORS})
def artifact(name: str, request: Request, _who: AnyCaller, state: State) -> Response:
    path = state.artifact_path(name)
    if path is None:
        raise NotFoundError(f"artifact {name[:80]!r}")
    sha = state.manifest_sha256 if name == "manifest.json" else state.manifest.sha256[name]
    return file_response(path, sha, request, state)
