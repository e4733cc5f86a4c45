"""Serve one page from 127.0.0.1 on a free port until Ctrl-C (the standard library's HTTP
server: a page that needs no other file needs no more)."""

from __future__ import annotations

import http.server
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PageServer", "serve_page"]

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"  # this machine only: the page is the user's, not the network's


class PageServer(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that answers `/` and `/<name>` with the page and 404
    otherwise (it serves no other file of the page's directory)."""

    def __init__(self, page: Path, *, port: int = 0) -> None:
        self.page = page
        super().__init__((HOST, port), _PageHandler)

    @property
    def url(self) -> str:
        """The page's address."""
        return f"http://{HOST}:{self.server_address[1]}/{self.page.name}"


class _PageHandler(http.server.BaseHTTPRequestHandler):
    server: PageServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/", f"/{self.server.page.name}"):
            self.send_error(404, "only the page is served")
            return
        body = self.server.page.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


def serve_page(page: Path, *, ready: Callable[[str], None], port: int = 0) -> None:
    """Serve `page` until Ctrl-C (which ends it quietly); `ready(url)` is called once the
    server listens. Other exits (SIGTERM through the CLI) close the server on their way out."""
    with PageServer(page, port=port) as server:
        ready(server.url)
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            logger.info("stopped serving %s", server.url)
