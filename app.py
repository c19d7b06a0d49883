"""Chainlit hooks of the ERNIE chat service: each forwards to backend.web.hooks.ChatApp, which renders what
backend.chat.ChatService does."""

from __future__ import annotations

import chainlit as cl
from chainlit.data.base import BaseDataLayer
from chainlit.types import Feedback, ThreadDict

from backend.web.documents import DELETE_DOCUMENT, SHOW_LIBRARY
from backend.web.hooks import ChatApp
from backend.web.view import EXPORT, REGENERATE

# Made at import: Chainlit asks whether a login page is needed right after importing this file.
APP = ChatApp()

if APP.password_login_on:

    @cl.password_auth_callback
    async def password_login(username: str, password: str) -> cl.User | None:
        return await APP.password_login(username, password)


if APP.ways.oidc:

    @cl.oauth_callback
    async def oauth_login(*_: object) -> cl.User | None:
        return None  # never called: the app's own routes take over Chainlit's OAuth routes (backend.web.sign_in)


if APP.ways.proxy:

    @cl.header_auth_callback
    async def header_login(*_: object) -> cl.User | None:
        return None  # never called: the app's own /auth/header believes trusted proxies only (backend.web.sign_in)


@cl.data_layer
def data_layer() -> BaseDataLayer | None:
    return APP.data_layer()


@cl.on_app_startup
async def startup() -> None:
    await APP.startup()


@cl.on_app_shutdown
async def shutdown() -> None:
    await APP.shutdown()


@cl.set_starters
async def first_page_starters(user: cl.User | None, language: str | None = None) -> list[cl.Starter]:
    return await APP.starters(language)


@cl.on_chat_start
async def chat_start() -> None:
    await APP.chat_start()


@cl.on_chat_resume
async def chat_resume(thread: ThreadDict) -> None:
    await APP.chat_resume(thread)


@cl.on_stop
async def stopped() -> None:
    await APP.stopped()


@cl.on_feedback
async def feedback(given: Feedback) -> None:
    await APP.feedback(given)


@cl.on_chat_end
async def chat_end() -> None:
    await APP.chat_end()


@cl.on_settings_update
async def settings_update(values: dict) -> None:
    await APP.settings_update(values)


@cl.on_message
async def on_message(message: cl.Message) -> None:
    await APP.on_message(message)


@cl.action_callback(REGENERATE)
async def regenerate(action: cl.Action) -> None:
    await APP.regenerate()


@cl.action_callback(EXPORT)
async def export(action: cl.Action) -> None:
    await APP.export(action)


@cl.action_callback(SHOW_LIBRARY)
async def library(action: cl.Action) -> None:
    await APP.show_library()


@cl.action_callback(DELETE_DOCUMENT)
async def delete(action: cl.Action) -> None:
    await APP.delete_document(action)
