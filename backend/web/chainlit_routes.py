"""Chainlit's own routes where they trust too much, taken over in front of them (Chainlit's handlers still do the
work; tests/integration/test_security.py notices a Chainlit release that renames or reshapes them):

- POST /login: failed attempts are throttled per name and per client address (backend.api.logins);
- POST /logout: the session ends on the server, not only in the browser (its token is refused from then on);
- PUT and DELETE /feedback: only on the user's own replies (Chainlit 2.12 writes a rating on any message id, and
  deletes any rating by its id, for any logged-in user)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from chainlit.auth import get_current_user
from chainlit.types import DeleteFeedbackRequest, UpdateFeedbackRequest
from fastapi import Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import OAuth2PasswordRequestForm
from starlette.datastructures import Headers

from backend.api.logins import Logins
from backend.errors import LoginThrottledError, StorageError
from backend.storage.database import HistoryStore
from backend.web.guard import login_token, refusal_body

log = logging.getLogger(__name__)


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _store() -> HistoryStore | None:
    from chainlit.data import get_data_layer

    layer = get_data_layer()
    return layer if isinstance(layer, HistoryStore) else None


def _not_found() -> HTTPException:
    return HTTPException(status_code=404, detail="Message not found")  # as Chainlit answers for another's thread


def login_routes(logins: Logins, auth_cookie: str) -> list[APIRoute]:
    """/login (throttled) and /logout (the session ends on the server); `auth_cookie`: Chainlit's login cookie."""
    import chainlit.server as chainlit_server

    async def login(
        request: Request, response: Response, form_data: Annotated[OAuth2PasswordRequestForm, Depends()]
    ) -> Any:
        try:
            attempt = await logins.admit(form_data.username, _client(request))
        except LoginThrottledError as exc:
            body = refusal_body(exc, 429, request.headers.get("accept-language", "en"), api=False)
            return JSONResponse(body, status_code=429, headers={"Retry-After": str(exc.retry_after_s)})
        except StorageError as exc:  # logins go on unthrottled rather than not at all; the log says why
            log.error("Login attempts not counted: %s", exc)
            return await chainlit_server.login(request, response, form_data)
        answer = await chainlit_server.login(request, response, form_data)  # 401 (raised) for a wrong password
        try:
            await logins.succeeded(attempt)
        except StorageError as exc:  # the user is in; the attempt still counts until it ages out
            log.error("A successful login was not taken off the count: %s", exc)
        return answer

    async def logout(request: Request, response: Response) -> Any:
        token = login_token(Headers(scope=request.scope), auth_cookie)
        if token is not None:
            try:
                await logins.end(token)
            except StorageError as exc:
                log.error("The session was not ended on the server: %s", exc)
        return await chainlit_server.logout(request, response)

    return [
        APIRoute("/login", login, methods=["POST"], include_in_schema=False),
        APIRoute("/logout", logout, methods=["POST"], include_in_schema=False),
    ]


def feedback_routes() -> list[APIRoute]:
    """PUT and DELETE /feedback, for the user's own replies only."""
    import chainlit.server as chainlit_server
    from chainlit.session import WebsocketSession

    async def update(
        request: Request, update: UpdateFeedbackRequest, current_user: Annotated[Any, Depends(get_current_user)]
    ) -> Any:
        store = _store()
        if store is not None and current_user is not None:
            feedback = update.feedback
            owner, thread = await store.step_owner(feedback.forId)
            earlier = await store.feedback_step(feedback.id) if feedback.id else None
            session = WebsocketSession.get_by_id(update.sessionId)
            user = current_user.identifier
            others = session is not None and (session.user is None or session.user.identifier != user)
            if owner != user or earlier not in (None, feedback.forId) or others:
                log.info("Feedback of %s on another's message refused", user)
                raise _not_found()
            feedback.threadId = thread
        return await chainlit_server.update_feedback(request, update, current_user)

    async def delete(
        request: Request, payload: DeleteFeedbackRequest, current_user: Annotated[Any, Depends(get_current_user)]
    ) -> Any:
        store = _store()
        if store is not None and current_user is not None:
            step = await store.feedback_step(payload.feedbackId)
            owner, _ = await store.step_owner(step) if step is not None else ("", "")
            if owner != current_user.identifier:
                raise _not_found()
        return await chainlit_server.delete_feedback(request, payload, current_user)

    return [
        APIRoute("/feedback", update, methods=["PUT"], include_in_schema=False),
        APIRoute("/feedback", delete, methods=["DELETE"], include_in_schema=False),
    ]
