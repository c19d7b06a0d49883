"""Quotas per user, chat and API together: replies at once, requests per minute, tokens per UTC day; and the usage
they are counted from (prompt and reply tokens per user, day and route). The store the chat's quota
(backend.chat.quota) and the API (backend.api.router) take their places from.

Every count is in the database, changed in one transaction per request: the request is written first and then
counted, so two app processes admitting the same user at once cannot both take the last place (SQLite lets one
writer in at a time; on PostgreSQL the transaction holds the user's advisory lock).

A place (a lease) is kept fresh by the process that holds it (every third of api.lease_s); one left by a process that
died stops counting lease_s after its last refresh, and Retry-After says so when such places are all a user has."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from backend.chat.quota import Lease, Route
from backend.config import ApiSettings
from backend.errors import QuotaError, ServiceError
from backend.storage.shared import SharedDatabase

log = logging.getLogger(__name__)

WINDOW_S = 60.0
BUSY_RETRY_S = 5  # Retry-After when all of a user's places are taken (replies usually take seconds)
REFRESHES = 3  # a held place is refreshed this many times per api.lease_s


def utc_day(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).date().isoformat()


def seconds_to_midnight(at: float) -> int:
    now = datetime.fromtimestamp(at, UTC)
    midnight = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    return max(1, math.ceil((midnight - now).total_seconds()))


@dataclass(frozen=True)
class UsageRow:
    user: str
    day: str
    route: str
    requests: int
    prompt_tokens: int
    reply_tokens: int

    def json(self) -> dict[str, Any]:
        return self.__dict__.copy()


class Quotas:
    """Admits requests within each user's limits (ApiSettings.limits) and records what they used."""

    def __init__(self, db: SharedDatabase, settings: ApiSettings, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock
        self.held: dict[str, Lease] = {}  # this process's places, refreshed while held
        self._refresher: asyncio.Task[None] | None = None

    def busy_retry_s(self, started: list[float], now: float) -> int:
        """Retry-After when all of a user's places are taken, from when each was last refreshed: a few seconds while
        one is held by a live process (a reply may end any moment), else until the first stale one stops counting."""
        fresh_s = self.settings.lease_s / REFRESHES * 1.5  # a live holder refreshed it within this
        if not started or any(now - at <= fresh_s for at in started):
            return BUSY_RETRY_S
        return max(1, math.ceil(min(started) + self.settings.lease_s - now))

    async def admit(self, user: str, route: Route) -> Lease:
        """Take a place for one request of `user`, or raise QuotaError (with the seconds to wait)."""
        now = self.clock()
        lease = Lease(str(uuid.uuid4()), user, route, at=now)
        limits = self.settings.limits(user)
        params = {"user": user, "now": now, "id": lease.id}
        async with self.db.transaction(user) as conn:
            # Written first: from here the transaction holds the write lock (SQLite), and counts include this one.
            await conn.execute(text('INSERT INTO quota_requests ("user_name", "at") VALUES (:user, :now)'), params)
            await conn.execute(
                text('INSERT INTO quota_leases ("id", "user_name", "started") VALUES (:id, :user, :now)'), params
            )
            await conn.execute(
                text('DELETE FROM quota_requests WHERE "user_name" = :user AND "at" <= :old'),
                {"user": user, "old": now - WINDOW_S},
            )
            await conn.execute(
                text('DELETE FROM quota_leases WHERE "started" <= :stale'), {"stale": now - self.settings.lease_s}
            )
            if limits.concurrent:
                started = (
                    await conn.execute(
                        text('SELECT "started" FROM quota_leases WHERE "user_name" = :user AND "id" <> :id'), params
                    )
                ).scalars()
                others = [float(at) for at in started]
                if len(others) >= limits.concurrent:
                    retry = self.busy_retry_s(others, now)
                    raise QuotaError.of("quota.concurrent", limit=limits.concurrent, retry_s=retry)
            if limits.requests_per_minute:
                times = (
                    (
                        await conn.execute(
                            text('SELECT "at" FROM quota_requests WHERE "user_name" = :user ORDER BY "at"'), params
                        )
                    )
                    .scalars()
                    .all()
                )
                over = len(times) - limits.requests_per_minute
                if over > 0:
                    retry = math.ceil(float(times[over - 1]) + WINDOW_S - now)
                    raise QuotaError.of("quota.rate", limit=limits.requests_per_minute, retry_s=max(1, retry))
            if limits.tokens_per_day:
                used = (
                    await conn.execute(
                        text(
                            'SELECT COALESCE(SUM("prompt_tokens" + "reply_tokens"), 0) FROM usage_daily '
                            'WHERE "user_name" = :user AND "day" = :day'
                        ),
                        {"user": user, "day": utc_day(now)},
                    )
                ).scalar_one()
                if int(used) >= limits.tokens_per_day:
                    raise QuotaError.of(
                        "quota.tokens", limit=limits.tokens_per_day, used=int(used), retry_s=seconds_to_midnight(now)
                    )
        self.held[lease.id] = lease
        self._keep_fresh()
        return lease

    def _keep_fresh(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while self.held:
            await asyncio.sleep(self.settings.lease_s / REFRESHES)
            if self.db.closed:
                return
            try:
                await self.refresh()
            except ServiceError as exc:  # the places go stale if this goes on: they free themselves then
                log.error("Quota places not refreshed: %s", exc)

    async def refresh(self) -> None:
        """Mark this process's places as still held (a process that died leaves its own to go stale)."""
        ids, now = list(self.held), self.clock()
        async with self.db.transaction() as conn:
            for lease_id in ids:
                await conn.execute(
                    text('UPDATE quota_leases SET "started" = :now WHERE "id" = :id'), {"now": now, "id": lease_id}
                )

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()

    async def withdraw(self, lease: Lease) -> None:
        """Take back a request that was refused before the engine was asked for a reply (a message the chat or the
        API refused): its place, and its count in the minute; it adds nothing to the day's usage."""
        self.held.pop(lease.id, None)
        async with self.db.transaction(lease.user) as conn:
            await conn.execute(text('DELETE FROM quota_leases WHERE "id" = :id'), {"id": lease.id})
            await conn.execute(
                text('DELETE FROM quota_requests WHERE "user_name" = :user AND "at" = :at'),
                {"user": lease.user, "at": lease.at},
            )

    async def release(self, lease: Lease) -> None:
        """Give the place back and add the request's tokens to its user's usage of the day."""
        self.held.pop(lease.id, None)
        day = utc_day(self.clock())
        async with self.db.transaction(lease.user) as conn:
            await conn.execute(text('DELETE FROM quota_leases WHERE "id" = :id'), {"id": lease.id})
            await conn.execute(
                text(
                    "INSERT INTO usage_daily "
                    '("user_name", "day", "route", "requests", "prompt_tokens", "reply_tokens") '
                    "VALUES (:user, :day, :route, 1, :prompt, :reply) "
                    'ON CONFLICT ("user_name", "day", "route") DO UPDATE SET '
                    '"requests" = usage_daily."requests" + 1, '
                    '"prompt_tokens" = usage_daily."prompt_tokens" + excluded."prompt_tokens", '
                    '"reply_tokens" = usage_daily."reply_tokens" + excluded."reply_tokens"'
                ),
                {
                    "user": lease.user,
                    "day": day,
                    "route": lease.route,
                    "prompt": lease.prompt_tokens,
                    "reply": lease.reply_tokens,
                },
            )

    async def release_soon(self, lease: Lease, counted: bool = True) -> None:
        """release() (or, not `counted`, withdraw()), finished even when the request's task is being cancelled (a
        client that went away)."""
        try:
            await asyncio.shield(asyncio.ensure_future(self._release_logged(lease, counted)))
        except asyncio.CancelledError:
            pass  # the release goes on in its own task

    async def _release_logged(self, lease: Lease, counted: bool) -> None:
        try:
            await (self.release(lease) if counted else self.withdraw(lease))
        except ServiceError as exc:  # the place is freed anyway once the lease is stale (api.lease_s)
            log.error("Quota release failed: %s", exc)

    @asynccontextmanager
    async def hold(self, user: str, route: Route) -> AsyncIterator[Lease]:
        """A place for one request for as long as the block runs (QuotaError when there is none)."""
        lease = await self.admit(user, route)
        try:
            yield lease
        finally:
            await self.release_soon(lease)

    async def usage(self, user: str | None = None, since_day: str | None = None) -> list[UsageRow]:
        """Usage rows (of `user`, from `since_day`), newest day first."""
        where, params = [], {"user": user, "since": since_day}
        if user is not None:
            where.append('"user_name" = :user')
        if since_day is not None:
            where.append('"day" >= :since')
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        async with self.db.transaction() as conn:
            rows = await conn.execute(
                text(
                    'SELECT "user_name", "day", "route", "requests", "prompt_tokens", "reply_tokens" FROM usage_daily'
                    f'{clause} ORDER BY "day" DESC, "user_name", "route"'
                ),
                params,
            )
            return [UsageRow(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows]
