"""Log output: human-readable lines, or one JSON object per line for log collectors.

A record may carry structured fields (`extra={"fields": {...}}`): the access log puts
the request's method, path, status, session, token counts and timings there. Text
lines show the message alone (which already names those fields); JSON lines carry
the fields as keys of their own, so nobody has to parse the message.
"""
from __future__ import annotations

import datetime
import json
import logging
import sys

FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        obj = {"time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        obj.update(getattr(record, "fields", {}))
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False, default=str)


def configure(level: str, fmt: str) -> None:
    """Send llmd's logs to stderr at `level` ("info", ...) in `fmt` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
