"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests and CI (no network).

It serves run folders with the Hub's URL layout, ``/<owner>/<repo>/resolve/<revision>/<path>``,
and the headers huggingface_hub reads: ``X-Repo-Commit``, ``ETag`` (the file's SHA-256, as the Hub
gives for LFS files), ``Content-Length``, ``Accept-Ranges`` and, for ``Range: bytes=N-``, a 206 with
``Content-Range``. A missing repository, revision or file is a 404 with the Hub's ``X-Error-Code``.
Faults for the tests: ``flip`` (files served with one byte flipped), ``cut`` (the first GET of a
file stops after that many bytes), ``silent`` (accepts connections and never answers).

    python tests/hub_stand_in.py tfmatcomp/pretrained     # serves tfmatcomp/<run> for each run
    # prints "HF_ENDPOINT=http://127.0.0.1:PORT"; stop it with Ctrl-C

Used through ``HF_ENDPOINT``: ``HF_ENDPOINT=http://127.0.0.1:PORT tfmatcomp models pull paper-4l8h``.
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")


class HubStandIn:
    """The server; ``with HubStandIn({"tfmatcomp/tiny": folder}) as hub: hub.endpoint``."""

    def __init__(self, repos: dict[str, Path], revision: str = "v0.1.0", *,
                 flip: set[str] = frozenset(), cut: dict[str, int] | None = None,
                 silent: bool = False) -> None:
        self.repos = {k: Path(v) for k, v in repos.items()}
        self.revision = revision
        self.flip, self.cut, self.silent = set(flip), dict(cut or {}), silent
        #: every request: (method, path, Range header or None)
        self.requests: list[tuple[str, str, str | None]] = []
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _error(self, code: str, status: int = 404) -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", code)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _serve(self, body: bool) -> None:
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if hub.silent:
                    hub._stop.wait(120)
                    return
                m = _RESOLVE.fullmatch(self.path.split("?")[0])
                if not m:
                    return self._error("RepoNotFound")
                repo, revision, rel = m.group(1), unquote(m.group(2)), unquote(m.group(3))
                if repo not in hub.repos:
                    return self._error("RepoNotFound")
                if revision != hub.revision:
                    return self._error("RevisionNotFound")
                root = hub.repos[repo].resolve()
                file = (root / rel).resolve()
                if root not in file.parents or not file.is_file():
                    return self._error("EntryNotFound")
                data = file.read_bytes()
                etag = hashlib.sha256(data).hexdigest()
                if rel in hub.flip:
                    data = data[:-1] + bytes([data[-1] ^ 1])
                start = 0
                rng = self.headers.get("Range")
                if rng and (r := re.fullmatch(r"bytes=(\d+)-", rng)):
                    start = int(r.group(1))
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                payload = data[start:]
                cut = hub.cut.pop(rel, None)
                if cut is not None:  # the transfer breaks off: part of the body, then the socket
                    self.wfile.write(payload[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(payload)

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

        return Handler


def serve_pretrained(folder: Path, **faults) -> HubStandIn:
    """A stand-in serving each run folder ``folder/<run>`` as ``tfmatcomp/<run>``."""
    repos = {f"tfmatcomp/{p.name}": p for p in Path(folder).iterdir()
             if (p / "pretrained.json").is_file()}
    return HubStandIn(repos, **faults)


if __name__ == "__main__":
    with serve_pretrained(Path(sys.argv[1] if len(sys.argv) > 1 else "tfmatcomp/pretrained")) as h:
        print(f"HF_ENDPOINT={h.endpoint}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
