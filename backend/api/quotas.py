"""Quotas per user, chat and API together: replies at once, requests per minute, tokens per UTC day; and the usage
they are counted from (prompt and reply tokens per user, day and route).

Every count is in the database, changed in one transaction per request: the request is written first and then
counted, so two app processes admitting the same user at once cannot both take the last place (SQLite lets one
writer in at a time; on PostgreSQL the transaction holds the user's advisory lock)."""

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
from typing import Any, Literal

from sqlalchemy import text

from backend.api.store import ApiDatabase
from backend.config import ApiSettings
from backend.errors import QuotaError, ServiceError

log = logging.getLogger(__name__)

Route = Literal["chat", "api"]
WINDOW_S = 60.0
BUSY_RETRY_S = 5  # Retry-After when all of a user's places are taken (replies usually take seconds)


def utc_day(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).date().isoformat()


def seconds_to_midnight(at: float) -> int:
    now = datetime.fromtimestamp(at, UTC)
    midnight = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    return max(1, math.ceil((midnight - now).total_seconds()))


@dataclass
class Lease:
    """One admitted request: release it with the tokens it used (Quotas.hold does)."""

    id: str
    user: str
    route: Route
    prompt_tokens: int = 0
    reply_tokens: int = 0

    def record(self, prompt_tokens: int | None, reply_tokens: int | None) -> None:
        self.prompt_tokens, self.reply_tokens = int(prompt_tokens or 0), int(reply_tokens or 0)


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

    def __init__(self, db: ApiDatabase, settings: ApiSettings, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock

    async def admit(self, user: str, route: Route) -> Lease:
        """Take a place for one request of `user`, or raise QuotaError (with the seconds to wait)."""
        now, lease = self.clock(), Lease(str(uuid.uuid4()), user, route)
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
                running = (
                    await conn.execute(text('SELECT COUNT(*) FROM quota_leases WHERE "user_name" = :user'), params)
                ).scalar_one()
                if running > limits.concurrent:
                    raise QuotaError.of("quota.concurrent", limit=limits.concurrent, retry_s=BUSY_RETRY_S)
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
        return lease

    async def release(self, lease: Lease) -> None:
        """Give the place back and add the request's tokens to its user's usage of the day."""
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

    async def release_soon(self, lease: Lease) -> None:
        """release(), finished even when the request's task is being cancelled (a client that went away)."""
        try:
            await asyncio.shield(asyncio.ensure_future(self._release_logged(lease)))
        except asyncio.CancelledError:
            pass  # the release goes on in its own task

    async def _release_logged(self, lease: Lease) -> None:
        try:
            await self.release(lease)
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
