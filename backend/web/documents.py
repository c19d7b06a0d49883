"""Documents on Chainlit's page: files attached to a message taken into the owner's library, the library listed with
a delete button for each document, the upload route guarded (backend.documents.uploads), and Chainlit's upload
settings taken from the configuration (documents.*), so the page's upload button offers what the library takes."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.session import WebsocketSession
from starlette.types import Scope

from backend.chat.i18n import describe, t
from backend.config import DocumentSettings
from backend.documents.extract import accepted_types
from backend.documents.library import Library, max_bytes
from backend.documents.uploads import guard_uploads, session_of
from backend.errors import DocumentError, ServiceError
from backend.web.replies import owner_of
from backend.web.view import say

log = logging.getLogger(__name__)

SHOW_LIBRARY, DELETE_DOCUMENT = "documents", "delete_document"  # app.py's action callbacks (backend.web.hooks)


def apply_upload_settings(settings: DocumentSettings) -> None:
    """Chainlit's upload button as the library takes files: its kinds, its size, a message's files at most."""
    upload = chainlit_config.features.spontaneous_file_upload
    if upload is None:
        return
    upload.enabled = settings.enabled
    upload.accept = accepted_types()
    upload.max_size_mb = max(1, int(settings.max_file_mb))
    upload.max_files = min(settings.max_documents, 10)


def install_upload_guard(library: Library, login: bool) -> None:
    """Guard Chainlit's upload route with the library's limits (size, kind, a full library)."""
    from chainlit.server import app  # Chainlit's app, as ops/web.py takes it

    async def check(scope: Scope) -> None:
        session = WebsocketSession.get_by_id(session_of(scope) or "")
        if session is None:
            return  # Chainlit's own route answers 404
        owner = owner_of(session, login)
        if len(await library.documents(owner)) >= library.settings.max_documents:
            raise DocumentError.of("documents.library_full", limit=library.settings.max_documents)

    guard_uploads(app.router.routes, max_bytes(library.settings), f"{library.settings.max_file_mb:g}", check)


def _attached(elements: list[Any] | None) -> list[tuple[str, str]]:
    """(name, path) of the files attached to a message (Chainlit keeps each in the session's upload folder)."""
    return [(str(e.name), str(e.path)) for e in elements or [] if getattr(e, "path", None)]


async def take_attachments(library: Library, owner: str, elements: list[Any] | None, lang: str) -> int:
    """Take the files attached to a message into the owner's library, saying for each what became of it; Chainlit's
    copy is deleted at once (the library keeps the file). Returns how many were taken."""
    taken = 0
    for name, path in _attached(elements):
        try:
            data = await asyncio.to_thread(Path(path).read_bytes)
            info, cut = await library.add(owner, name, data)
        except ServiceError as exc:
            await say(t("document_refused", lang, name=name, error=describe(exc, lang)))
            continue
        except OSError as exc:
            log.warning("An attached file could not be read: %s", exc)
            continue
        finally:
            try:
                os.remove(path)
            except OSError:
                pass
        taken += 1
        text = t("document_added", lang, name=info.name, passages=info.passages)
        if cut:
            text += " " + t("document_cut", lang, chars=library.settings.max_chars)
        notice = await say(text)
        await _library_button(notice, lang)
    return taken


async def _library_button(message: cl.Message, lang: str) -> None:
    action = cl.Action(name=SHOW_LIBRARY, payload={}, label=t("action_documents", lang), icon="library")
    await action.send(for_id=message.id)


async def show_library(library: Library, owner: str, lang: str) -> None:
    """The owner's documents, with a delete button for each."""
    documents = await library.documents(owner)
    if not documents:
        await say(t("documents_none", lang))
        return
    lines = [t("documents_list", lang, count=len(documents), limit=library.settings.max_documents)]
    lines += [f"- {doc.name} ({doc.passages}, {doc.size / 1024:.0f} KB)" for doc in documents]
    notice = await say("\n".join(lines))
    for doc in documents:
        label = t("action_delete_document", lang, name=doc.name)
        await cl.Action(name=DELETE_DOCUMENT, payload={"id": doc.id, "name": doc.name}, label=label,
                        icon="trash-2").send(for_id=notice.id)  # fmt: skip


async def delete_document(library: Library, owner: str, payload: dict[str, Any], lang: str) -> None:
    """Delete a document the owner chose in the library's list."""
    try:
        await library.delete(owner, str(payload.get("id")))
    except ServiceError as exc:
        await say(t("error", lang, error=describe(exc, lang)))
        return
    await say(t("document_deleted", lang, name=str(payload.get("name"))))
