"""A receiving service for destination tests: records each request, answers as scripted."""

from __future__ import annotations

import ssl
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from werkzeug.serving import make_server

from tests.servers import thread_server

# No answer is held longer than this, whatever a test does (a server thread never hangs).
HOLD_LIMIT_SECONDS = 30.0


@dataclass
class Answer:
    """One scripted answer: status, headers, body; `hold` keeps it back until the test ends."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    hold: bool = False
    drip_every: float | None = None  # send the body a byte at a time, this far apart


@dataclass(frozen=True)
class Received:
    """One request as the receiving service saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A WSGI app: answers from a script (then `default`) and keeps every request."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.script: deque[Answer] = deque()
        self.default = Answer()
        self.released = threading.Event()  # set at the end: every held answer goes out

    def answer(self, *answers: Answer) -> None:
        """Queue answers for the next requests."""
        self.script.extend(answers)

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        self.requests.append(Received(environ["REQUEST_METHOD"], environ["PATH_INFO"],
                                      headers, body))
        answer = self.script.popleft() if self.script else self.default
        if answer.hold:
            self.released.wait(HOLD_LIMIT_SECONDS)
        start_response(f"{answer.status} X", [("Connection", "close"),
                                              *answer.headers.items()])
        if answer.drip_every is not None:
            return self._drip(answer.body, answer.drip_every)
        return [answer.body]

    def _drip(self, body: bytes, every: float) -> Iterator[bytes]:
        """Yield the body a byte at a time until the test ends."""
        for byte in body:
            if self.released.wait(every):
                return
            yield bytes([byte])


@contextmanager
def receiving(ssl_context: ssl.SSLContext | None = None) -> Iterator[tuple[str, Receiver]]:
    """Serve a Receiver on a free loopback port (https with `ssl_context`); release held
    answers at the end."""
    receiver = Receiver()
    if ssl_context is None:
        with thread_server(receiver) as base_url:  # type: ignore[arg-type]
            try:
                yield base_url, receiver
            finally:
                receiver.released.set()
        return
    server = make_server("127.0.0.1", 0, receiver, threaded=True, ssl_context=ssl_context)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}", receiver
    finally:
        receiver.released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def certificate_authority(host: str, tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Return (server context with a certificate for `host`, client context trusting its CA)."""
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    now = datetime.now(UTC)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ledger test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_name).public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = tmp / "leaf.pem", tmp / "leaf.key"
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_path, key_path)
    client = ssl.create_default_context(
        cadata=ca.public_bytes(serialization.Encoding.PEM).decode())
    return server, client
