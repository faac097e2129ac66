"""Prints what Alertmanager sends: a stand-in for a pager while you try the alerting recipe (docs/getting-started.md).

python3 examples/print_webhook.py 9099    # deploy/alertmanager/alertmanager.yml sends to 127.0.0.1:9099
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class _Webhook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the standard library's handler naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            payload = json.loads(body)
        except ValueError:
            payload = {}
        for alert in payload.get("alerts", []):
            labels, notes = alert.get("labels", {}), alert.get("annotations", {})
            print(
                f"{self.path} {alert.get('status', '?'):8} {labels.get('severity', '-'):8} "
                f"{labels.get('alertname', '?')} rank={labels.get('rank', '-')}: {notes.get('description', '')}",
                flush=True,
            )
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # the base class's signature
        pass


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9099
    print(f"listening on 127.0.0.1:{port} for Alertmanager webhooks", flush=True)
    HTTPServer(("127.0.0.1", port), _Webhook).serve_forever()


if __name__ == "__main__":
    main()
