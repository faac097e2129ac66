"""An Alertmanager webhook receiver: records every notification (one JSON document per POST) with its arrival."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Webhook:
    """Serves on a free loopback port; `notifications` holds each POST's JSON plus `path` and `received_at`."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server interface
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append({"path": self.path, "received_at": time.time(), **json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self, project: str | None = None) -> list[tuple[str, str, str]]:
        """(alertname, project, receiver path) of every firing alert delivered so far."""
        return [
            (a["labels"]["alertname"], a["labels"].get("project", ""), n["path"])
            for n in list(self.notifications)
            for a in n["alerts"]
            if a["status"] == "firing" and (project is None or a["labels"].get("project") == project)
        ]

    def first_firing(self, project: str, alertname: str) -> dict[str, Any] | None:
        """The first notification that delivered `alertname` firing for `project`."""
        for notification in list(self.notifications):
            if any(
                a["status"] == "firing"
                and a["labels"]["alertname"] == alertname
                and a["labels"].get("project") == project
                for a in notification["alerts"]
            ):
                return notification
        return None

    def close(self) -> None:
        self.server.shutdown()
