"""Serve one page from 127.0.0.1 on a free port until Ctrl-C (the standard library's HTTP
server: a page that needs no other file needs no more).

Only this machine's browser gets the page: the server listens on the loopback address, and it
answers 403 to a request whose `Host` is not a loopback name with the served port (a web page
elsewhere could otherwise point a name of its own at 127.0.0.1 and read the page: DNS
rebinding). The page's address is percent-encoded, so a name with spaces or non-ASCII letters
is a working URL, and the server decodes the request's path before comparing it."""

from __future__ import annotations

import http.server
import logging
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PageServer", "serve_page"]

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"  # this machine only: the page is the user's, not the network's
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")  # what a browser here may send as Host


class PageServer(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that answers `/` and `/<name>` with the page and 404
    otherwise (it serves no other file of the page's directory)."""

    def __init__(self, page: Path, *, port: int = 0) -> None:
        self.page = page
        super().__init__((HOST, port), _PageHandler)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """The page's address (its name percent-encoded)."""
        return f"http://{HOST}:{self.port}/{urllib.parse.quote(self.page.name)}"

    def allows_host(self, host: str | None) -> bool:
        """Whether a request's `Host` header names this server by a loopback name."""
        if host is None:
            return False
        return host.strip().lower() in {f"{name}:{self.port}" for name in LOOPBACK_NAMES}


class _PageHandler(http.server.BaseHTTPRequestHandler):
    server: PageServer

    def do_GET(self) -> None:
        if not self.server.allows_host(self.headers.get("Host")):
            self.send_error(403, "only this machine's loopback names are served")
            return
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path, errors="replace")
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
