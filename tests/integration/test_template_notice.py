"""A broken template file, as the README promises: the chat says which file, line and field and what it must be,
once per change, in the user's language; the chat goes on with the template's last good version; a fixed file
is used again at the next message. The real app and engine (llama.cpp serving the tiny ERNIE model: any engine will
do, and it starts in seconds), over the page's websocket."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from backend.config import ROOT
from tests.app_process import RunningApp, start_app
from tests.chat_api import ChatSocket, rendered_finished

pytestmark = pytest.mark.integration

GOOD = "temperature: 0.8"
BROKEN = "temperature: hot"


@pytest_asyncio.fixture(scope="module")
async def site(spm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RunningApp, Path]]:
    root = tmp_path_factory.mktemp("template-notice")
    prompts = root / "prompts"
    shutil.copytree(ROOT / "prompts", prompts)
    assert GOOD in (prompts / "writing.yaml").read_text(), "the test edits writing.yaml's temperature line"
    app = start_app(root / "data", engine__name="llama.cpp", model__id=str(spm_model), paths__prompts_dir=str(prompts))
    try:
        await asyncio.to_thread(app.wait_ready)
        yield app, prompts
    finally:
        app.kill()


async def test_a_broken_file_is_told_once_with_its_line_and_the_chat_goes_on(site: tuple[RunningApp, Path]) -> None:
    app, prompts = site
    writing = prompts / "writing.yaml"
    line = next(n for n, text in enumerate(writing.read_text().splitlines(), 1) if text == GOOD)
    writing.write_text(writing.read_text().replace(GOOD, BROKEN))
    try:
        for lang, words in (("en-US", "Some prompt templates have problems"), ("zh-CN", "部分提示模板有错误")):
            chat = ChatSocket(app.url, None, language=lang)
            await chat.connect()  # a new chat is told at its start (app.py on_chat_start), else at its next message
            await chat.ask("写一首关于春天的短诗")  # a writing message: the broken file's template
            assert chat.last_reply is not None and rendered_finished(chat.last_reply), chat.last_reply
            await chat.ask("写一首关于秋天的短诗")
            assert chat.last_reply is not None and rendered_finished(chat.last_reply), chat.last_reply
            told = [n for n in chat.notices() if words in n]
            assert len(told) == 1, f"told once per change, not at every message: {chat.notices()}"
            assert "writing.yaml" in told[0] and f"line {line}" in told[0] and "temperature" in told[0], told[0]
            await chat.close()
    finally:
        writing.write_text(writing.read_text().replace(BROKEN, GOOD))
    chat = ChatSocket(app.url, None)
    await chat.connect()
    await chat.ask("写一首关于夏天的短诗")
    assert not [n for n in chat.notices() if "problems" in n], "a fixed file is nothing to tell"
    await chat.close()
