"""The workshop's HTTP surface on Chainlit's own FastAPI app: the page at /workshop and its API at /workshop/api.

Every API route first asks backend.workshop.access whether the request may use the workshop (403 otherwise).
Errors come back as {"error": {"code", "message", "hint"}} in the language of the request's Accept-Language;
a draft with problems also carries "problems", the lines check-prompts prints.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.routing import BaseRoute, Mount

from backend.accounts.login import Accounts
from backend.chat.i18n import t
from backend.chat.render import localized, reason_text, serving_status
from backend.chat.service import ChatService
from backend.errors import QuotaError, WorkshopError
from backend.prompts.schema import display_path, form_fields
from backend.workshop.access import Access, Editor, Identify
from backend.workshop.drafts import (
    draft_folder,
    form_yaml,
    leading_comments,
    preview,
    problem_json,
    template_files,
    yaml_fields,
)
from backend.workshop.files import DraftRefused, TemplateFiles
from backend.workshop.history import History, open_history
from backend.workshop.tryout import try_reply
from backend.workshop.versions import ABSENT, Version, unified_diff, version_tag

PAGE = "/workshop"
API = "/workshop/api"
STATIC = Path(__file__).resolve().parent / "static"

STATUS = {
    "workshop.login_needed": 403,
    "workshop.not_editor": 403,
    "workshop.remote": 403,
    "workshop.not_found": 404,
    "workshop.no_version": 404,
    "workshop.exists": 409,
    "workshop.conflict": 409,
    "workshop.problems": 422,
    "workshop.problems_new": 422,
    "workshop.draft_problems": 422,
    "workshop.engine_not_ready": 503,
    "workshop.write_failed": 500,
    "workshop.history_failed": 503,
}


class Draft(BaseModel):
    """A template as the page sends it: its YAML text, or its form fields (then made into YAML)."""

    yaml: str | None = None
    fields: dict[str, Any] | None = None

    def text(self, current: str | None = None) -> str:
        """The YAML text; form fields keep the comment lines at the top of `current` (the file's text now)."""
        return self.yaml if self.yaml is not None else form_yaml(self.fields or {}, leading_comments(current))


class NamedDraft(Draft):
    stem: str  # the file: writing -> prompts/writing.yaml


class SampleDraft(NamedDraft):
    message: str


class TryDraft(SampleDraft):
    side: Literal["draft", "saved"] = "draft"


class Save(Draft):
    base: str  # the version tag the editor started from
    note: str = ""


class Create(NamedDraft):
    note: str = ""


class Copy(BaseModel):
    stem: str


class Restore(BaseModel):
    version: int
    base: str


def _locale(request: Request) -> str:
    return request.headers.get("accept-language", "en")


def _error_body(exc: WorkshopError, request: Request) -> dict[str, Any]:
    message, hint = exc.localized(_locale(request))
    return {"error": {"code": exc.code, "message": message, "hint": hint}}


def _refusal(exc: WorkshopError, request: Request) -> JSONResponse:
    body = _error_body(exc, request)
    if isinstance(exc, DraftRefused):
        body["problems"] = [problem_json(p) for p in exc.problems]
    return JSONResponse(body, status_code=STATUS.get(exc.code or "", 400))


def _guarded(access: Access, route: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The route behind the access check; its `who` is the editor, and a WorkshopError becomes the JSON refusal.

    FastAPI reads the parameters from the signature, which leaves `who` out (it is not part of the request)."""
    signature = inspect.signature(route)

    @functools.wraps(route)
    async def wrapped(request: Request, **kwargs: Any) -> Any:
        try:
            return await route(request, who=access.check(request), **kwargs)
        except WorkshopError as exc:
            return _refusal(exc, request)

    wrapped.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for p in signature.parameters.values() if p.name != "who"]
    )
    return wrapped


def _version_json(version: Version) -> dict[str, Any]:
    return {"number": version.number, "tag": version.tag, "who": version.who, "when": version.when,
            "note": version.note, "action": version.action}  # fmt: skip


# A quota place for one reply of a user (None without login), as the chat takes one (backend.chat.quota's
# ChatQuota.place): it raises QuotaError when the user is over a quota, and counts the reply's tokens recorded on what
# it yields.
Admit = Callable[[str | None], AbstractAsyncContextManager[Any]]


@asynccontextmanager
async def _unlimited(user: str | None) -> AsyncIterator[None]:
    yield None


class Workshop:
    """The routes, with what they work on: the chat service (its templates, engine and client) and the files."""

    def __init__(
        self,
        service: ChatService,
        access: Access | None = None,
        history: History | None = None,
        admit: Admit | None = None,
    ) -> None:
        self.service = service
        self.access = access or Access(service.cfg)
        self.folder = service.templates.folder
        self.history = history or open_history(service.cfg)
        self.files = TemplateFiles(self.folder, self.history)
        self.admit = admit or _unlimited  # a try is a reply of the editor's: it counts against their quotas

    # ----- reading ----------------------------------------------------------------------------------------------
    async def _saved_number(self, stem: str, tag: str) -> int | None:
        latest = await self.history.latest(stem)
        return latest.number if latest is not None and latest.tag == tag else None

    async def listing(self, locale: str) -> list[dict[str, Any]]:
        """Every template file with what routing uses of it, as the chat's store has it now."""
        store = self.service.templates
        by_path = {t.path: t for t in map(store.get, store.names())}
        problems = store.problems()
        rows = []
        for stem, path in template_files(self.folder).items():
            shown = display_path(path)
            template = by_path.get(shown)
            text = self.files.read(stem)
            tag = version_tag(text)
            rows.append({
                "stem": stem,
                "file": shown,
                "name": template.name if template else None,
                "description": template.description if template else "",
                "description_shown": localized(template.description, locale) if template else "",
                "priority": template.priority if template else None,
                "keywords": list(template.keywords) if template else [],
                "patterns": [p.pattern for p in template.patterns] if template else [],
                "route_on_demo": template.route_on_demo if template else None,
                "version": tag,
                "number": await self._saved_number(stem, tag),
                "problems": sum(1 for p in problems if p.path == shown),
            })  # fmt: skip
        return rows

    async def one(self, stem: str) -> dict[str, Any]:
        text, tag = self.files.current(stem)
        with draft_folder(self.folder, stem, text) as check:
            problems = [problem_json(p) for p in check.problems]
        return {"stem": stem, "file": display_path(self.files.path(stem)), "yaml": text, "fields": yaml_fields(text),
                "version": tag, "number": await self._saved_number(stem, tag), "problems": problems}  # fmt: skip

    def check(self, draft: NamedDraft) -> dict[str, Any]:
        text = draft.text(self.files.read(draft.stem))  # a bad file name is refused like everywhere else
        with draft_folder(self.folder, draft.stem, text) as check:
            problems = [problem_json(p) for p in check.problems]
        return {"yaml": text, "fields": yaml_fields(text), "problems": problems}

    def serving(self, locale: str) -> dict[str, Any]:
        """Which model answers in the chat now, and what that means for routing, in the editor's language."""
        serving = self.service.serving()
        shown = serving_status(serving, locale)
        return {"model": serving.model, "demo": serving.demo, "state": serving.state,
                "text": t("workshop_serving", locale, serving=shown["serving"], state=shown["state"]),
                "routing": t("workshop_routing_demo" if serving.demo else "workshop_routing", locale)}  # fmt: skip

    async def preview(self, draft: SampleDraft, locale: str) -> dict[str, Any]:
        text = draft.text(self.files.read(draft.stem))
        with draft_folder(self.folder, draft.stem, text) as check:
            result = await preview(self.service, check, draft.message)
            result["problems"] = [problem_json(p) for p in check.problems]
        result["serving"] = self.serving(locale)
        routing = result["routing"]  # the reasons as the chat's reply details word them
        routing["reason_shown"] = reason_text(routing["reason"], locale)
        if "request" in result:
            result["request"]["reason_shown"] = reason_text(result["request"]["reason"], locale)
        for candidate in routing["candidates"]:
            candidate["reason_shown"] = reason_text(candidate["reason"], locale) if candidate["reason"] else None
        return result

    def compare(self, stem: str, draft: Draft) -> dict[str, Any]:
        """The changes from the file as it is now to the draft (what to merge after a conflict)."""
        current = self.files.read(stem)
        return {"diff": unified_diff(current or "", draft.text(current), "current", "draft")}

    async def tryout(self, draft: TryDraft, locale: str, user: str | None = None) -> AsyncIterator[bytes]:
        """NDJSON lines of one reply with the draft (or the saved file) chosen, within `user`'s quotas."""
        try:
            async with self.admit(user) as lease:
                async for line in self._tryout(draft, locale, lease):
                    yield line
        except QuotaError as exc:
            message, hint = exc.localized(locale)
            yield (json.dumps({"error": {"code": exc.code, "message": message, "hint": hint}}) + "\n").encode()

    async def _tryout(self, draft: TryDraft, locale: str, lease: Any) -> AsyncIterator[bytes]:
        if lease is not None:  # counted once the engine is asked for the reply (a refusal before counts nothing)
            lease.asked = False
        saved = self.files.read(draft.stem)
        text = draft.text(saved) if draft.side == "draft" else saved
        with draft_folder(self.folder, draft.stem, text) as check:
            if check.template is None:
                problem = (
                    WorkshopError.of("workshop.not_found", name=draft.stem)
                    if text is None
                    else WorkshopError.of("workshop.draft_problems", count=len(check.problems))
                )
                message, hint = problem.localized(locale)
                yield (json.dumps({"error": {"code": problem.code, "message": message, "hint": hint}}) + "\n").encode()
                return
            events = try_reply(self.service, check.store, check.template.name, draft.message, locale)
            first = await anext(events)  # the request is built while the draft's folder exists
        if lease is not None:
            lease.asked = "request" in first
        yield (json.dumps(first, ensure_ascii=False) + "\n").encode()
        prompt = first.get("request", {}).get("prompt_tokens")
        async for event in events:
            if "done" in event and lease is not None:
                lease.record(prompt, event["done"].get("completion_tokens"))
            yield (json.dumps(event, ensure_ascii=False) + "\n").encode()

    async def diff(self, stem: str, old: str, new: str) -> dict[str, Any]:
        texts = []
        for which in (old, new):
            if which == "current":
                texts.append(self.files.read(stem) or "")
                continue
            text = await self.history.text(stem, int(which)) if which.isdigit() else None
            if text is None and not (which.isdigit() and 1 <= int(which) <= len(await self.history.versions(stem))):
                raise WorkshopError.of("workshop.no_version", name=stem, version=which)
            texts.append(text or "")
        label = {"current": "current"}
        return {"diff": unified_diff(texts[0], texts[1], label.get(old, f"version {old}"),
                                     label.get(new, f"version {new}"))}  # fmt: skip

    # ----- the routes -------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        router = APIRouter(prefix=API)

        def guarded(route: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            return _guarded(self.access, route)

        @router.get("/me")
        async def me(request: Request) -> Response:
            try:
                who = self.access.check(request)
            except WorkshopError as exc:
                return JSONResponse({"may_edit": False, "login": self.access.login, **_error_body(exc, request)})
            return JSONResponse({"may_edit": True, "login": self.access.login, "user": who.name, "role": who.role,
                                 "serving": self.serving(_locale(request))})  # fmt: skip

        @router.get("/fields")
        async def fields(request: Request) -> Any:
            return {"fields": form_fields()}  # the form's fields and ranges, from the template schema

        @router.get("/templates")
        @guarded
        async def list_templates(request: Request, who: Editor) -> Any:
            return {"templates": await self.listing(_locale(request))}

        @router.get("/templates/{stem}")
        @guarded
        async def get_template(request: Request, stem: str, who: Editor) -> Any:
            return await self.one(stem)

        @router.post("/check")
        @guarded
        async def check(request: Request, body: NamedDraft, who: Editor) -> Any:
            return self.check(body)

        @router.post("/preview")
        @guarded
        async def preview_draft(request: Request, body: SampleDraft, who: Editor) -> Any:
            return await self.preview(body, _locale(request))

        @router.post("/try")
        @guarded
        async def try_draft(request: Request, body: TryDraft, who: Editor) -> Any:
            self.files.path(body.stem)
            user = who.name if self.access.login else None  # without login there are no users and no quotas
            return StreamingResponse(self.tryout(body, _locale(request), user), media_type="application/x-ndjson")

        @router.post("/templates")
        @guarded
        async def create(request: Request, body: Create, who: Editor) -> Any:
            version = await self.files.create(body.stem, body.text(), who.name, body.note)
            return JSONResponse({"saved": _version_json(version), **await self.one(body.stem)}, status_code=201)

        @router.put("/templates/{stem}")
        @guarded
        async def save(request: Request, stem: str, body: Save, who: Editor) -> Any:
            version = await self.files.save(stem, body.text(self.files.read(stem)), body.base, who.name, body.note)
            return {"saved": _version_json(version), **await self.one(stem)}

        @router.post("/templates/{stem}/duplicate")
        @guarded
        async def duplicate(request: Request, stem: str, body: Copy, who: Editor) -> Any:
            version = await self.files.duplicate(stem, body.stem, who.name)
            return JSONResponse({"saved": _version_json(version), **await self.one(body.stem)}, status_code=201)

        @router.delete("/templates/{stem}")
        @guarded
        async def delete(request: Request, stem: str, base: str, who: Editor) -> Any:
            return {"saved": _version_json(await self.files.delete(stem, base, who.name))}

        @router.post("/templates/{stem}/compare")
        @guarded
        async def compare(request: Request, stem: str, body: Draft, who: Editor) -> Any:
            self.files.path(stem)
            return self.compare(stem, body)

        @router.get("/templates/{stem}/versions")
        @guarded
        async def versions(request: Request, stem: str, who: Editor) -> Any:
            self.files.path(stem)
            current = version_tag(self.files.read(stem))
            found = [_version_json(v) for v in reversed(await self.history.versions(stem))]
            return {"versions": found, "current": current if current != ABSENT else None}

        @router.get("/templates/{stem}/versions/{number}")
        @guarded
        async def version_text(request: Request, stem: str, number: int, who: Editor) -> Any:
            self.files.path(stem)
            text = await self.history.text(stem, number)
            if text is None:
                raise WorkshopError.of("workshop.no_version", name=stem, version=number)
            return {"yaml": text, "fields": yaml_fields(text), "tag": version_tag(text)}

        @router.get("/templates/{stem}/diff")
        @guarded
        async def diff(request: Request, stem: str, old: str, who: Editor, new: str = "current") -> Any:
            self.files.path(stem)
            return await self.diff(stem, old, new)

        @router.post("/templates/{stem}/restore")
        @guarded
        async def restore(request: Request, stem: str, body: Restore, who: Editor) -> Any:
            version = await self.files.restore(stem, body.version, body.base, who.name)
            return {"saved": _version_json(version), **await self.one(stem)}

        async def page() -> FileResponse:
            return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

        router_page = APIRouter()
        router_page.add_api_route(PAGE, page, methods=["GET"], include_in_schema=False)
        return [*router.routes, *router_page.routes, Mount(PAGE + "/static", StaticFiles(directory=STATIC))]


def workshop_routes(
    service: ChatService, identify: Identify, admit: Admit | None = None, accounts: Accounts | None = None
) -> list[BaseRoute]:
    """The workshop's page and API routes, for backend.web.routes to put in front of Chainlit's catch-all; `admit`: the
    quota place a try takes (none: unlimited); `accounts`: the process's users and roles (the API's, the login's);
    `identify`: whose login a request carries."""
    return Workshop(service, access=Access(service.cfg, accounts, identify), admit=admit).routes()
