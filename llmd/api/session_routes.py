"""The session routes: GET /v1/sessions lists the named sessions, GET and DELETE
/v1/sessions/{id} describe and free one, POST /v1/sessions/{id}/reset clears its
context and keeps its slot."""
from __future__ import annotations

from llmd import errors
from llmd.api.answers import json_response
from llmd.engine.native import Engine
from llmd.http.server import HttpRequest, Response
from llmd.serving.sessions import SessionTable, session_id_of


class SessionRoutes:
    """Each API key sees and acts on its own sessions only (SessionTable.sessions);
    the counts are the whole server's."""

    def __init__(self, engine: Engine, table: SessionTable):
        self.engine, self.table = engine, table

    async def list_sessions(self, request: HttpRequest) -> Response:
        data = [self.table.describe(s) for s in self.table.sessions(request.principal)]
        # The engine's own count next to the table's: they differ only while frees
        # or opens are queued on the executor, so lasting disagreement is a leak.
        saved = {"saved_sessions": store.count, "saved_bytes": store.bytes_used} if (store := self.table.store) else {}
        return json_response({"object": "list", "data": data, "capacity": self.table.capacity - 1,
                              "in_use": self.table.in_use,
                              "engine_sessions": self.engine.live_sessions(),
                              "table_sessions": self.table.engine_sessions, **saved})

    async def get_session(self, request: HttpRequest, sid: str) -> Response:
        slot = self.table.get(valid_id(sid), request.principal)
        if slot is None:
            raise errors.session_not_found(sid)
        return json_response(self.table.describe(slot))

    async def delete_session(self, request: HttpRequest, sid: str) -> Response:
        deleted = self.table.delete(valid_id(sid), request.principal)
        return json_response({"id": sid, "object": "session.deleted", "deleted": deleted})

    async def reset_session(self, request: HttpRequest, sid: str) -> Response:
        reset = self.table.reset(valid_id(sid), request.principal)
        return json_response({"id": sid, "object": "session.reset", "reset": reset})


def valid_id(sid: str) -> str:
    """A session id from the path, validated as a request's is (400 invalid_session_id)."""
    return session_id_of(sid, {})
