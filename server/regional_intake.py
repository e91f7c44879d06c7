"""The root of a tree of servers (docs/SCALING.md, "Hierarchical aggregation"; PROTOCOL.md,
"Regional aggregation"): each regional server's sum for the open round, checked and stored
like an update, one per region, and the round's result once it closes.

A region is trusted with its devices' updates (it checks each against the round's base, as a
flat server does); the root checks what a region cannot hide in a sum: its layout, that it is
finite, that its weight could come from ``count`` devices, and that its mean lies within
``--max-update-norm`` of the base (the mean of updates that each do lies there too).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fedper.common import hierarchical, weights
from fedper.common.protocol import ErrorCode, Metadata, RegionAccepted, RegionView
from fedper.common.robust_aggregate import NonFiniteAggregateError, negative_variance
from fedper.common.strategy.round_strategy import RoundInputs, RoundResult
from fedper.server.clock import iso_time
from fedper.server.refusals import (
    AlreadyReportedError,
    MalformedError,
    NotFoundError,
    StaleBaseError,
    UnacceptableError,
)
from fedper.server.round_context import RoundContext
from fedper.server.storage import RoundState
from fedper.server.storage.regions import StoredRegionSum

log = logging.getLogger("fedper.server")

HEADER_ROOM = 1 << 20  # a sum's safetensors header and metadata, besides its float64 data
# Under DP: the mean of clipped deltas, recomputed from a float64 sum of the updates, may exceed
# the clip by rounding alone; a hostile region gains nothing from a billionth of it.
CLIP_SLACK = 1e-9
FLOAT32_MAX = float(np.finfo(np.float32).max)


class RegionalIntake:
    """``on_received(round, count)``: called under the lock after a sum is recorded."""

    def __init__(self, ctx: RoundContext, on_received: Callable[[int, int], None]) -> None:
        self.ctx, self._on_received = ctx, on_received
        self.regions = ctx.config.regions
        self.limit = 8 * sum(math.prod(shape) for _, shape in ctx.layout) + HEADER_ROOM

    def accept(self, number: int, region: int, data: bytes) -> RegionAccepted:
        """Region ``region``'s sum for round ``number``: stored, or refused with nothing changed.
        The same bytes again (a retry whose answer was lost) get the same answer."""
        ctx = self.ctx
        self._check_region(region)
        digest = hashlib.sha256(data).hexdigest()
        current = ctx.open_round(number)
        if self._again(number, region, digest):
            return RegionAccepted(round=number, region=region, regions_in=ctx.db.regions.count(number))
        summed = self._checked(data, region, current.model_version)
        with ctx.store.temp_file(".sum") as (temp, f):
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            with ctx.lock:
                relative: str | None = None
                try:
                    with ctx.db.transaction() as tx:
                        ctx.open_round(number)
                        if self._again(number, region, digest):
                            return RegionAccepted(round=number, region=region, regions_in=ctx.db.regions.count(number))
                        relative = ctx.store.commit(temp, number, f"region-{region}")
                        row = StoredRegionSum(number, region, relative, digest, summed.weight, summed.count)
                        ctx.db.regions.put_sum(tx, row, ctx.clock())
                except BaseException:
                    if relative is not None:
                        ctx.store.remove_file(relative)
                    raise
                finally:
                    ctx.refresh()
                count = ctx.snapshot.received
                log.info(json.dumps({"event": "region_sum_accepted", "round": number, "region": region,
                                     "devices": summed.count, "regions_in": count}))  # fmt: skip
                self._on_received(number, count)
                return RegionAccepted(round=number, region=region, regions_in=count)

    def _check_region(self, region: int) -> None:
        if not 0 <= region < self.regions:
            raise NotFoundError(f"region {region}: this root has regions 0..{self.regions - 1}")

    def _again(self, number: int, region: int, digest: str) -> bool:
        """Whether these bytes are already in; AlreadyReportedError for other bytes."""
        stored = self.ctx.db.regions.get(number, region)
        if stored is None:
            return False
        if stored.sha256 != digest:
            raise AlreadyReportedError(f"region {region} already forwarded another sum for round {number}")
        return True

    def _checked(self, data: bytes, region: int, model_version: int) -> hierarchical.RegionalSum:
        """The sum, decoded and checked against the round (400, 409, 422 with the reason)."""
        ctx = self.ctx
        source = f"region {region}'s sum"
        try:
            summed = hierarchical.decode(data, ctx.layout, source)
        except hierarchical.MalformedSumError as exc:
            raise MalformedError(ErrorCode.MALFORMED_SAFETENSORS, str(exc)) from exc
        except weights.WeightsError as exc:
            raise UnacceptableError(ErrorCode.BAD_REGIONAL_SUM, str(exc)) from exc
        if summed.region != region:
            raise UnacceptableError(ErrorCode.BAD_REGIONAL_SUM, f"{source} says it is region {summed.region}'s")
        if summed.base_version != model_version:
            raise StaleBaseError(f"{source} trained version {summed.base_version}; the round trains {model_version}")
        if summed.weight > summed.count * ctx.config.max_num_samples:
            raise UnacceptableError(
                ErrorCode.BAD_REGIONAL_SUM,
                f"{source} weighs {summed.weight}, more than {summed.count} devices of at most "
                f"{ctx.config.max_num_samples} examples each",
            )
        private = ctx.privacy is not None
        if private != (summed.unclipped is not None) or (private and summed.weight != summed.count):
            why = (
                f"under DP-FedAvg every weight is 1 and {Metadata.UNCLIPPED} counts the unclipped deltas"
                if private
                else f"this root runs no DP: {Metadata.UNCLIPPED} is not expected"
            )
            raise UnacceptableError(ErrorCode.BAD_REGIONAL_SUM, f"{source}: {why}")
        base = ctx.models.base(model_version)
        squared = 0.0
        for name, _ in ctx.layout:
            mean = summed.weighted_sum[name] / summed.weight
            if float(np.max(np.abs(mean), initial=0.0)) > FLOAT32_MAX:  # its updates were float32
                raise UnacceptableError(ErrorCode.BAD_REGIONAL_SUM, f"{source}: the mean of {name!r} is beyond float32")
            smallest = negative_variance(name, mean)
            if smallest is not None:
                why = f"{source}: the mean of BatchNorm variance {name!r} reaches {smallest:.4g}"
                raise UnacceptableError(ErrorCode.UPDATE_OUT_OF_BOUNDS, why)
            diff = (mean - base[name]).ravel()
            squared += float(np.dot(diff, diff))
        bound = ctx.privacy.clip() * (1 + CLIP_SLACK) if ctx.privacy is not None else ctx.config.max_update_norm
        if bound > 0 and math.sqrt(squared) > bound:
            raise UnacceptableError(
                ErrorCode.UPDATE_OUT_OF_BOUNDS,
                f"{source}: its mean is at L2 distance {math.sqrt(squared):.4g} from the round's base; every "
                f"update is within {bound:g}, so their mean is too",
            )
        return summed

    # --- what the root tells a region -----------------------------------------------------

    def view(self, region: int) -> RegionView:
        ctx = self.ctx
        self._check_region(region)
        current = ctx.db.rounds.latest()
        assert current is not None
        finished = ctx.finished()
        is_open = current.state == RoundState.OPEN and not finished
        return RegionView(
            region=region,
            regions=self.regions,
            round=current.round if is_open else None,
            model_version=current.model_version if is_open else ctx.db.versions.latest(),
            deadline=iso_time(current.deadline) if is_open else None,
            forwarded=is_open and ctx.db.regions.get(current.round, region) is not None,
            finished=finished,
            dp_clip=ctx.privacy.clip() if ctx.privacy is not None else None,
            dp_sampling_probability=ctx.config.privacy.dp_sampling_probability if ctx.privacy is not None else None,
        )


def combined(ctx: RoundContext, number: int, noise: np.random.Generator | None = None) -> RoundResult:
    """Round ``number``'s result at a root: the stored sums, read back with the loader, added in
    ascending region and divided once (:func:`fedper.common.hierarchical.combine`); under DP the
    regions' sums of clipped deltas noised once, here, by the one DP-FedAvg (``noise``: its
    generator), noise alone when no region sent one."""
    sums = []
    for row in ctx.db.regions.sums(number):
        path = ctx.store.updates_dir / row.file
        sums.append(hierarchical.decode(path.read_bytes(), ctx.layout, str(path)))
    if ctx.privacy is None:
        with np.errstate(over="ignore"):  # checked below: a sum's mean fits float32, so theirs should
            base = hierarchical.combine(ctx.layout, sums)
        if not all(np.isfinite(values).all() for values in base.values()):
            raise NonFiniteAggregateError(f"the regions' sums of round {number} combine beyond float32")
        return RoundResult(base, sum(s.count for s in sums))
    current = ctx.db.rounds.get(number)
    assert current is not None
    base = ctx.models.base(current.model_version)
    count = sum(s.count for s in sums)
    deltas = {}
    for name, shape in ctx.layout:
        acc = np.zeros(shape, dtype=np.float64)
        for s in sorted(sums, key=lambda s: s.region):
            np.add(acc, s.weighted_sum[name], out=acc)
        deltas[name] = acc - count * base[name]
    mode = ctx.privacy.mode()
    inputs = RoundInputs(ctx.layout, base, noise=noise)
    unclipped = sum(s.unclipped or 0 for s in sums)
    return replace(mode.aggregate_sum(inputs, deltas, count, unclipped, mode.clip()), secure=False)
