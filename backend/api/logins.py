"""Logins, in the database the quotas use (so every app process sees the same counts): failed attempts throttled per
user name and per client address, and the sessions a logout ended.

Throttling (auth.throttle; docs/security.md): an attempt is written before its password is checked and taken back
when it succeeds, so attempts sent at once are counted at once. Once a name (or an address) has `per_name` (or
`per_address`) attempts within `window_s`, its next attempt waits 1 s after the last one, then twice as long after
each further failure, at most `max_wait_s`; an attempt made while it should wait is refused unchecked and not counted.
So a wrong password costs a guesser ever more time, and the most an attacker who knows a name can do to its owner is
make each of their attempts wait up to `max_wait_s` after one of the attacker's own.

Ended sessions: Chainlit's login token is a signed cookie valid for `user_session_timeout` (15 days), and its logout
only asks the browser to forget it. A logout here keeps the token's SHA-256 until the token would have expired, and
backend.web.guard takes an ended token off every request."""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import text

from backend.config import LoginThrottle
from backend.errors import LoginThrottledError, StorageError
from backend.storage.shared import SharedDatabase

log = logging.getLogger(__name__)

CHECKED_S = 2.0  # a token found not ended is not asked about again for this long (another process's logout waits)
CHECKED_MAX = 10_000  # tokens remembered as not ended, at most


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def wait_s(attempts: list[float], free: int, max_wait_s: float, now: float) -> float:
    """How long the next attempt must still wait, given the times of the recent attempts of one name or address."""
    if len(attempts) < free:
        return 0.0
    wait = min(2.0 ** (len(attempts) - free), max_wait_s)
    return max(0.0, max(attempts) + wait - now)


@dataclass(frozen=True)
class Attempt:
    """One login attempt, counted until it succeeds (Logins.succeeded)."""

    id: str
    name_key: str


class Logins:
    """Failed logins per name and per address, and ended sessions, in the app's database."""

    def __init__(
        self, db: SharedDatabase, throttle: LoginThrottle, session_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.db = db
        self.throttle = throttle
        self.session_s = session_s  # how long a login token is valid (Chainlit's user_session_timeout)
        self.clock = clock
        self._ended: set[str] = set()  # tokens this process knows ended
        self._checked: dict[str, float] = {}  # tokens found not ended, and when (time.monotonic)

    # ----- throttling -------------------------------------------------------------------------------------------
    async def admit(self, name: str, address: str) -> Attempt:
        """Count one attempt of `name` from `address`, or raise LoginThrottledError (with the seconds to wait)."""
        now, attempt = self.clock(), Attempt(str(uuid.uuid4()), "name:" + name[:128])
        keys = {attempt.name_key: self.throttle.per_name, "address:" + address: self.throttle.per_address}
        async with self.db.transaction(attempt.name_key) as conn:
            await conn.execute(
                text('DELETE FROM login_attempts WHERE "at" <= :old'), {"old": now - self.throttle.window_s}
            )
            waits = []
            for key, free in keys.items():
                rows = await conn.execute(text('SELECT "at" FROM login_attempts WHERE "key" = :key'), {"key": key})
                waits.append(wait_s([float(at) for at in rows.scalars()], free, self.throttle.max_wait_s, now))
            if max(waits) > 0:
                log.info("Login of %r from %s refused unchecked: it must wait %.1f s", name[:64], address, max(waits))
                raise LoginThrottledError.of("login.throttled", retry_s=math.ceil(max(waits)))
            for key in keys:
                await conn.execute(
                    text('INSERT INTO login_attempts ("id", "key", "at") VALUES (:id, :key, :at)'),
                    {"id": attempt.id, "key": key, "at": now},
                )
        return attempt

    async def succeeded(self, attempt: Attempt) -> None:
        """The attempt was right: it no longer counts, nor do the name's failures before it (its address's do)."""
        async with self.db.transaction(attempt.name_key) as conn:
            await conn.execute(text('DELETE FROM login_attempts WHERE "id" = :id'), {"id": attempt.id})
            await conn.execute(text('DELETE FROM login_attempts WHERE "key" = :key'), {"key": attempt.name_key})

    # ----- ended sessions ---------------------------------------------------------------------------------------
    async def end(self, token: str) -> None:
        """End the session of `token` (a logout): refused by every app process from now on."""
        digest, now = token_hash(token), self.clock()
        self._ended.add(digest)
        self._checked.pop(digest, None)
        async with self.db.transaction() as conn:
            await conn.execute(text('DELETE FROM ended_sessions WHERE "ended" <= :old'), {"old": now - self.session_s})
            await conn.execute(text('DELETE FROM ended_sessions WHERE "token_hash" = :h'), {"h": digest})
            await conn.execute(
                text('INSERT INTO ended_sessions ("token_hash", "ended") VALUES (:h, :now)'), {"h": digest, "now": now}
            )

    async def ended(self, token: str) -> bool:
        """Whether the session of `token` was ended (by a logout on any app process)."""
        digest = token_hash(token)
        if digest in self._ended:
            return True
        seen = self._checked.get(digest)
        if seen is not None and time.monotonic() - seen < CHECKED_S:
            return False
        try:
            async with self.db.transaction() as conn:
                found = await conn.execute(text('SELECT 1 FROM ended_sessions WHERE "token_hash" = :h'), {"h": digest})
                ended = found.first() is not None
        except StorageError as exc:  # the login stays as it was; the log says why logouts may not hold
            log.error("Ended sessions not checked: %s", exc)
            return False
        if ended:
            self._ended.add(digest)
        else:
            if len(self._checked) >= CHECKED_MAX:
                self._checked.clear()
            self._checked[digest] = time.monotonic()
        return ended
