"""A package index on loopback answering the JSON simple API (PEP 691) for any project: one wheel of the version
installed in the serving interpreter, with a made-up sha256, and a file of another version (nothing is downloaded
from it). `raybench cluster wheel` reads the hashes it pins from it where the real index is out of reach (the
launcher tests; the on-prem rehearsal's network namespace, where it runs as `python fake_index.py PORT`)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def fake_sha256(name: str, version: str) -> str:
    return hashlib.sha256(f"{name}=={version}".encode()).hexdigest()


class _Index(BaseHTTPRequestHandler):
    def do_GET(self):
        from packaging.version import Version

        name = self.path.strip("/").split("/")[-1]
        try:
            version = Version(importlib.metadata.version(name)).public
        except importlib.metadata.PackageNotFoundError:
            self.send_error(404)
            return
        files = [{"filename": f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
                  "hashes": {"sha256": fake_sha256(name, version)}},
                 {"filename": f"{name}-0.0.1.tar.gz", "hashes": {"sha256": "0" * 64}}]  # another version
        body = json.dumps({"name": name, "files": files}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def start(port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Serve in a daemon thread; -> (server, index URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/simple"


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), _Index).serve_forever()
