"""The app process (`chainlit run app.py`, as `make run` starts it) on each database: SQLite by default, PostgreSQL
when storage.database_url names one, given here as a hosting service writes it (postgresql://, no driver). The
schema is created on start; a conversation and the feedback on its reply outlive a restart, and resuming it gives
the model the earlier turn. The engine is the in-process StubEngine (tests/stub_engine.py), which records what the
model was asked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.storage.schema import LATEST
from tests.app_process import RunningApp, start_app, storage_problems
from tests.chat_api import ChatSocket, login, rendered_finished
from tests.stub_engine import StubEngine

pytestmark = [pytest.mark.integration]

PASSWORD = "alice-password"
REPLY = "Paris."


@pytest.fixture(scope="module")
def engine() -> Iterator[StubEngine]:
    with StubEngine(reply=REPLY) as fake:
        yield fake


def start(root: Path, engine: StubEngine, database_url: str) -> RunningApp:
    users = root / "users.yaml"
    if not users.exists():
        write_users_file(users, {"alice": hash_password(PASSWORD)})
    storage = {"storage__database_url": database_url.replace("postgresql+asyncpg://", "postgresql://", 1)}
    app = start_app(
        root / "data",
        auth__enabled="true",
        auth__users_file=str(users),
        **(storage if database_url else {}),
        **engine.app_overrides(),
    )
    app.wait_ready()
    return app


async def test_a_conversation_and_its_feedback_outlive_a_restart_and_resume_with_history(
    app_db_url: str, engine: StubEngine, tmp_path: Path
) -> None:
    app = await asyncio.to_thread(start, tmp_path, engine, app_db_url)
    try:
        saved_in = "postgresql+asyncpg://" if app_db_url else str(tmp_path / "data" / "chat.db")
        assert f"Conversations are saved in {saved_in}" in app.log_text()
        assert f"(schema version {LATEST})" in app.log_text()
        alice = await login(app.url, "alice", PASSWORD)
        chat = ChatSocket(app.url, alice)
        await chat.connect()
        await chat.ask("What is the capital of France?")
        await chat.close()
        reply, tid = chat.last_reply, chat.thread_id
        assert reply is not None and rendered_finished(reply) and tid, chat.events
        asked_first = engine.conversations()[-1]
        feedback = {"forId": reply["id"], "threadId": tid, "value": 1, "comment": "right"}
        rated = await alice.put("/feedback", json={"feedback": feedback, "sessionId": ""})
        assert rated.status_code == 200, rated.text
        await alice.aclose()
    finally:
        app.stop()

    app = await asyncio.to_thread(start, tmp_path, engine, app_db_url)  # as after `make run` again
    try:
        # the log holds both starts: the first applied every migration, the second found the schema done
        applied = app.log_text().count("Database schema: applying")
        assert applied == LATEST, f"{applied} migrations applied over two starts; the schema has {LATEST} versions"
        alice = await login(app.url, "alice", PASSWORD)
        thread = (await alice.get(f"/project/thread/{tid}")).json()
        kept = next(s for s in thread["steps"] if s["id"] == reply["id"])
        assert kept["feedback"]["value"] == 1 and kept["feedback"]["comment"] == "right"

        resumed = ChatSocket(app.url, alice)
        await resumed.connect(resume=tid)
        await resumed.ask("And of Germany?")
        await resumed.close()
        asked = engine.conversations()[-1]
        assert asked[: len(asked_first)] == asked_first, "the first question, as the model saw it"
        assert asked[len(asked_first)] == ("assistant", REPLY) and asked[-1][0] == "user" and len(asked) == 3
        assert storage_problems(app.log_text()) == [], "no storage errors"
        await alice.aclose()
    finally:
        app.stop()
