"""The upload use case: one device's base update into a round, in the protocol's order of
checks: 410, 404, the 409s that need no body, 409 ``upload_in_progress``, 503, 413, 408, 400,
422, then the 409s again (the body took time) and ``stale_base_version``.

The body is streamed to a temporary file, validated (:mod:`server.upload_validation`, with the
round mode's refusals), staged as a canonical file and committed; a refused upload leaves
nothing behind, and is counted and logged with its code.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from anyio import to_thread

from fedper.common.manifest import Manifest
from fedper.server.config import ServerConfig
from fedper.server.disk_room import out_of_space
from fedper.server.errors import code_of
from fedper.server.metrics_registry import MetricsRegistry
from fedper.server.refusals import NotFoundError, RefusalError, RunFinishedError
from fedper.server.request_body import Body, BodyPace, streamed_to_file
from fedper.server.rounds import RoundManager
from fedper.server.storage import StorageError
from fedper.server.upload_places import UploadPlaces
from fedper.server.upload_validation import validate

log = logging.getLogger("fedper.server")


@dataclass
class Uploads:
    config: ServerConfig
    manifest: Manifest
    rounds: RoundManager
    places: UploadPlaces
    metrics: MetricsRegistry
    max_bytes: int

    async def receive(self, device_id: str, number: int, body: Body) -> int:
        """Store the device's update of round ``number``; the round's count of updates after it."""
        try:
            size, received = await self._receive(device_id, number, body)
        except RefusalError as exc:
            self.metrics.reject(code_of(exc))
            self.rounds.refused_upload(code_of(exc))
            log.info(json.dumps({"event": "upload_rejected", "device": device_id, "round": number,
                                 "code": code_of(exc)}))  # fmt: skip
            raise
        self.metrics.accept(size)
        log.info(json.dumps({"event": "update_accepted", "device": device_id, "round": number,
                             "received": received}))  # fmt: skip
        return received

    async def _receive(self, device_id: str, number: int, body: Body) -> tuple[int, int]:
        rounds, c = self.rounds, self.config
        if rounds.snapshot.finished:
            raise RunFinishedError()
        if not rounds.round_exists(number):
            raise NotFoundError(f"round {number}")
        try:
            await to_thread.run_sync(rounds.check_admission, device_id, number)
            with self.places.take(device_id, number) as place:
                pace = BodyPace(c.upload_timeout, c.min_upload_rate, c.upload_rate_grace)
                async with streamed_to_file(body, self.max_bytes, pace, rounds.store, place) as path:
                    size = path.stat().st_size
                    mode = rounds.mode()
                    base = await to_thread.run_sync(rounds.round_base, number) if mode.needs_base() else None
                    parsed = await to_thread.run_sync(validate, path, self.manifest, c.max_num_samples, mode, base)
                staged = await to_thread.run_sync(rounds.stage, device_id, number, parsed)
                try:
                    received = await to_thread.run_sync(rounds.commit, staged)
                finally:
                    rounds.discard(staged)  # a no-op once committed (the file was renamed away)
        except (OSError, StorageError) as exc:
            if not out_of_space(exc):
                raise
            raise rounds.out_of_space(exc) from exc
        return size, received
