"""The app's view of itself and its engine, as /healthz answers it (backend.web.routes) and the tests read it."""

from __future__ import annotations

from typing import Any

from backend.chat.service import ChatService


def health_payload(service: ChatService) -> dict[str, Any]:
    """The app's view of itself and its engine (no secrets)."""
    st = service.supervisor.status
    draining = service.restarting() is not None
    return {
        "status": "draining" if draining else "ok" if service.supervisor.ready else "degraded",
        "engine": {
            "name": service.supervisor.spec.engine if service.supervisor.spec else None,
            "state": st.state.value,
            "for_s": round(st.elapsed_s, 1),
            "restarts": st.restarts,
            "pid": st.pid,
            "adopted": st.adopted,  # kept running by the app's last run and adopted (engine.keep_running)
            "error": st.error,
            "base_url": service.endpoint.base_url,
            "model": service.endpoint.model,
            "note": st.note,
        },
        # The canary (backend.serving.canary): which way of running the engine serves, what its answer check said,
        # and which ones were tried before and why they were dropped.
        "check": service.supervisor.canary.summary() if service.supervisor.canary else None,
        # The engine tune (backend.tuning): which engine and format measured fastest on this machine, and the figures.
        "tune": service.supervisor.tune,
        # The line in front of the engine (backend.chat.admission): its places (the engine's replies at once), who
        # runs and waits now, how many were told "busy", and the reply time its expected waits are made of.
        "line": line_payload(service),
    }


def line_payload(service: ChatService) -> dict[str, Any] | None:
    line = service.line()
    if line is None:
        return None
    return {
        "places": line.capacity,
        "running": len(line.running),
        "waiting": line.waiting,
        "refused": line.refused,
        "reply_s": round(line.reply_s, 1),
        "place_s": round(line.place_s, 2),  # seconds between places freed while all are taken (the expected waits)
    }
