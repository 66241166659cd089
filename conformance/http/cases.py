"""The HTTP conformance suite's cases, listed once: what every front end must answer, black
box over HTTP (design §3, §4, docs/problems.md). Each case is a function of a :class:`Service`
(the front end under test, started with one of the configurations below) that raises
``AssertionError`` on a failure and may return a note for the results table.

The charges a service made are counted from its ledger file, so "executed once" means one
charge, whatever the answers said.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

#: The configurations cases run under, as additions to conformance/http/idem.toml:
#: top-level settings (before the file's tables) and tables (after).
VARIANTS: Dict[str, Tuple[str, str]] = {
    "default": ("", ""),
    "anonymous": ('anonymous = "allow"\n', ""),
    "stripe": ("", '\n[problems]\nformat = "stripe"\n'),
    "relay": ("", ""),  # the store reached through a relay the case cuts
}

CALLER = {"authorization": "Bearer agent-1"}
JSON = {"content-type": "application/json"}


@dataclass
class Reply:
    status: int
    headers: Dict[str, List[str]]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        v = self.headers.get(name.lower())
        return v[0] if v else None

    def json(self):
        return json.loads(self.body or b"null")

    def problem(self) -> str:
        """The problem's name, from an RFC 9457 document or a Stripe envelope."""
        try:
            doc = self.json()
        except ValueError:
            return ""
        if isinstance(doc, dict) and isinstance(doc.get("type"), str):
            return doc["type"].rsplit(":", 1)[-1]
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            return str(doc["error"].get("code", ""))
        return ""

    def replayed(self) -> bool:
        return self.header("idempotent-replayed") == "true"

    def __repr__(self) -> str:
        return f"{self.status} {self.headers} {self.body[:300]!r}"


@dataclass
class Service:
    """The front end under test, as the cases see it."""

    base: str
    name: str
    count: Callable[[], int]
    #: SIGKILL the front end, then start it again on the same store (the crash case).
    crash_and_restart: Callable[[], None]
    #: The store URL the front end uses (for idem inspect).
    store: str
    inspect: Callable[[str, str], str]
    #: What the front end's framework does with a handler's exception.
    raises: str = ""
    cut: Optional[Callable[[bool], None]] = None
    #: The path the service is mounted under (Express under ``app.use("/api", ...)``): every
    #: request's path is below it.
    prefix: str = ""

    def request(self, method: str, path: str, headers: Optional[dict] = None, body: bytes = b"", timeout: float = 30) -> Reply:
        u = urlsplit(self.base)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        try:
            c.putrequest(method, self.prefix + path, skip_accept_encoding=True)
            for n, v in (headers or {}).items():
                for one in v if isinstance(v, list) else [v]:
                    c.putheader(n, one)
            if body or method not in ("GET", "HEAD"):
                c.putheader("content-length", str(len(body)))
            c.endheaders(body)
            r = c.getresponse()
            headers: Dict[str, List[str]] = {}
            for n, v in r.getheaders():
                headers.setdefault(n.lower(), []).append(v)
            return Reply(r.status, headers, r.read())
        finally:
            c.close()

    def charge(self, key: Optional[str], fields: Optional[dict] = None, path: str = "/v1/charges", caller: Optional[dict] = CALLER, headers: Optional[dict] = None, raw: Optional[bytes] = None, timeout: float = 30) -> Reply:
        h = dict(JSON)
        if caller:
            h.update(caller)
        if key is not None:
            h["idempotency-key"] = key
        h.update(headers or {})
        body = raw if raw is not None else json.dumps(fields if fields is not None else {"customer": "cus_1", "amount_cents": 4900}).encode()
        return self.request("POST", path, h, body, timeout)

    def raw(self, data: bytes) -> bytes:
        """Bytes written to the front end as they are (what a client library would refuse to send)."""
        u = urlsplit(self.base)
        with socket.create_connection((u.hostname, u.port), timeout=10) as s:
            s.sendall(data)
            out = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                out += chunk
            return out


def key() -> str:
    return f"k-{uuid.uuid4().hex[:16]}"


def counted(svc: Service) -> Callable[[int], None]:
    """``delta(n)``: asserts the service charged ``n`` times since this was made."""
    start = svc.count()

    def delta(n: int) -> None:
        got = svc.count() - start
        assert got == n, f"{got} charges where {n} were expected"

    return delta


def in_background(f: Callable[[], Reply]) -> Callable[[], Reply]:
    """Runs ``f`` on a thread; the returned function joins it and returns its reply (or
    raises what it raised)."""
    out: List[Reply] = []
    errors: List[BaseException] = []

    def run() -> None:
        try:
            out.append(f())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join() -> Reply:
        t.join(60)
        if errors:
            raise errors[0]
        assert out, "the request never answered"
        return out[0]

    return join


def until(cond: Callable[[], bool], what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def is_problem(r: Reply, name: str, status: int) -> None:
    assert r.status == status and r.problem() == name, f"expected {status} {name}, got {r!r}"
    ct = r.header("content-type") or ""
    assert ct.startswith("application/problem+json"), f"not a problem document: {ct}"
    doc = r.json()
    for member in ("type", "title", "status", "detail"):
        assert member in doc, f"no {member} in {doc}"
    assert doc["status"] == status


# --- the cases ---------------------------------------------------------------------------

def key_missing(svc: Service):
    delta = counted(svc)
    is_problem(svc.charge(None), "key-missing", 400)
    delta(0)


def key_invalid(svc: Service):
    delta = counted(svc)
    # Fresh each run: a front end that accepts them must not meet an earlier run's record.
    run = uuid.uuid4().hex[:8]
    for bad in [f"two words {run}", run + "x" * 256, ""]:
        is_problem(svc.charge(bad), "key-invalid", 400)
    is_problem(svc.charge(None, headers={"idempotency-key": ["a", "b"]}), "key-invalid", 400)
    delta(0)


def replay(svc: Service):
    delta, k = counted(svc), key()
    first = svc.charge(k)
    assert first.status == 201 and not first.replayed(), first
    again = svc.charge(k)
    assert again.replayed(), again
    assert (again.status, again.body) == (first.status, first.body), (first, again)
    # A retry that re-serialised its JSON is the same request.
    reordered = svc.charge(k, raw=b'{ "amount_cents" : 4900, "customer" : "cus_1" }')
    assert reordered.replayed() and reordered.body == first.body, reordered
    delta(1)


def key_reused(svc: Service):
    delta, k = counted(svc), key()
    svc.charge(k)
    is_problem(svc.charge(k, {"customer": "cus_1", "amount_cents": 100}), "key-reused", 422)
    is_problem(svc.charge(k, path="/v1/waits"), "key-reused", 422)
    # The same bytes as another media type are another request.
    body = json.dumps({"customer": "cus_1", "amount_cents": 4900}).encode()
    is_problem(svc.charge(k, raw=body, headers={"content-type": "text/plain"}), "key-reused", 422)
    delta(1)


def in_flight(svc: Service):
    delta, k = counted(svc), key()
    slow = {"customer": "cus_1", "amount_cents": 1, "simulate": "slow", "delay_ms": 2500}
    first = in_background(lambda: svc.charge(k, slow))
    until(lambda: svc.count() > 0 and delta_is(svc, delta, 1), "the first request to charge")
    busy = svc.charge(k, slow)
    is_problem(busy, "in-flight", 409)
    assert busy.header("retry-after"), busy
    # Another body with the key is refused as reused, not as in flight (422 before 409).
    is_problem(svc.charge(k, {"customer": "cus_2"}), "key-reused", 422)
    assert first().status == 201
    assert svc.charge(k, slow).replayed()
    delta(1)


def delta_is(svc, delta, n) -> bool:
    try:
        delta(n)
        return True
    except AssertionError:
        return False


def waits(svc: Service):
    delta, k = counted(svc), key()
    slow = {"customer": "cus_1", "amount_cents": 1, "simulate": "slow", "delay_ms": 1500}
    first = in_background(lambda: svc.charge(k, slow, path="/v1/waits"))
    until(lambda: delta_is(svc, delta, 1), "the first request to charge")
    second = svc.charge(k, slow, path="/v1/waits")
    a = first()
    assert second.replayed() and second.body == a.body, (a, second)
    delta(1)


def concurrent_duplicates(svc: Service):
    delta, k = counted(svc), key()
    slow = {"customer": "cus_1", "amount_cents": 1, "simulate": "slow", "delay_ms": 300}
    joins = [in_background(lambda: svc.charge(k, slow, path="/v1/waits")) for _ in range(16)]
    replies = [j() for j in joins]
    bodies = {r.body for r in replies}
    assert all(r.status == 201 for r in replies) and len(bodies) == 1, replies
    assert sum(not r.replayed() for r in replies) == 1, "exactly one answer is the execution's own"
    delta(1)


def safe_and_unkeyed_pass(svc: Service):
    delta, k, get_key = counted(svc), key(), key()
    # A safe method with a key passes through; nothing is recorded (asked twice: the second
    # is no replay either).
    for _ in range(2):
        r = svc.request("GET", "/v1/charges", {**CALLER, "idempotency-key": get_key})
        assert r.status == 200 and "count" in r.json() and not r.replayed(), r
    # A route that does not require keys: each call without one runs.
    a = svc.request("POST", "/v1/echo", {**CALLER, **JSON}, b'{"n":1}')
    b = svc.request("POST", "/v1/echo", {**CALLER, **JSON}, b'{"n":1}')
    assert a.status == b.status == 200 and not a.replayed() and not b.replayed(), (a, b)
    # With a key there it is honoured.
    e1 = svc.request("POST", "/v1/echo", {**CALLER, **JSON, "idempotency-key": k}, b'{"n":2}')
    e2 = svc.request("POST", "/v1/echo", {**CALLER, **JSON, "idempotency-key": k}, b'{"n":2}')
    assert e2.replayed() and e2.body == e1.body, (e1, e2)
    delta(0)


def callers_are_scoped(svc: Service):
    delta, k = counted(svc), key()
    alice = svc.charge(k, caller={"authorization": "Bearer alice"})
    bob = svc.charge(k, caller={"authorization": "Bearer bob"})
    assert not bob.replayed() and bob.body != alice.body, (alice, bob)
    assert svc.charge(k, caller={"authorization": "Bearer alice"}).body == alice.body
    assert svc.charge(k, caller={"x-api-key": "key-of-carol"}).status == 201
    delta(3)


def anonymous_refused(svc: Service):
    delta = counted(svc)
    is_problem(svc.charge(key(), caller=None), "principal-missing", 400)
    delta(0)


def cookies_stay_with_their_caller(svc: Service):
    delta, k = counted(svc), key()
    login = {"customer": "cus_1", "simulate": "cookie"}
    first = svc.charge(k, login)
    assert first.header("set-cookie"), f"the executing caller gets its cookie: {first!r}"
    again = svc.charge(k, login)
    assert again.replayed() and again.header("set-cookie") == first.header("set-cookie"), again
    delta(1)


def anonymous_scope_withholds_cookies(svc: Service):
    """Under ``anonymous = "allow"``: callers naming no one share a scope, in which per-caller
    headers are never stored or replayed."""
    delta, k = counted(svc), key()
    login = {"customer": "cus_1", "simulate": "cookie"}
    first = svc.charge(k, login, caller=None)
    assert first.status == 201 and first.header("set-cookie"), first
    again = svc.charge(k, login, caller=None)
    assert again.replayed() and again.header("set-cookie") is None, again
    delta(1)


def body_bound(svc: Service):
    delta = counted(svc)
    big = json.dumps({"customer": "cus_1", "pad": "x" * 70000}).encode()
    is_problem(svc.charge(key(), raw=big), "body-too-large", 413)
    delta(0)


def handler_raises(svc: Service):
    delta, k = counted(svc), key()
    failed = svc.charge(k, {"customer": "cus_1", "simulate": "raise"})
    assert failed.status >= 500, failed
    retry = svc.charge(k, {"customer": "cus_1", "simulate": "raise"})
    if retry.status == 409:
        is_problem(retry, "outcome-unknown", 409)
        note = "outcome-unknown"
    else:
        assert retry.replayed() and retry.status == failed.status, retry
        note = f"{failed.status} kept"
    delta(1)
    return note


def kept_and_released_statuses(svc: Service):
    delta, k, k2 = counted(svc), key(), key()
    oops = {"customer": "cus_1", "simulate": "status", "status": 500}
    first = svc.charge(k, oops)
    assert first.status == 500, first
    again = svc.charge(k, oops)
    assert again.replayed(), f"a 5xx is kept (Stripe's rule): {again!r}"
    slow_down = {"customer": "cus_1", "simulate": "status", "status": 429}
    released = svc.charge(k2, slow_down)
    assert released.status == 429, released
    again = svc.charge(k2, slow_down)
    assert again.status == 429 and not again.replayed(), "429 releases the key: the retry runs"
    delta(1)


def large_response(svc: Service):
    delta, k = counted(svc), key()
    big = {"customer": "cus_1", "simulate": "large", "size": 100000}
    first = svc.charge(k, big)
    assert first.status == 201 and len(first.body) > 100000, first.status
    again = svc.charge(k, big)
    is_problem(again, "response-too-large", 409)
    assert again.replayed() and again.json()["original_status"] == 201, again
    delta(1)


def request_spellings(svc: Service):
    delta = counted(svc)
    body = b'{"customer":"cus_1"}'
    notes = set()
    for method, target in [("post", "/v1/charges"), ("POST", "/v1/../v1/charges"), ("POST", "/v1/%2e%2e/v1/charges")]:
        head = f"{method} {svc.prefix}{target} HTTP/1.1\r\nHost: t\r\nauthorization: Bearer a\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        out = svc.raw(head.encode() + body)
        status = out.split(b" ", 2)[1].decode() if out.startswith(b"HTTP/1.") else "?"
        # 400 from idem (or from the server's parser). A router that runs before middleware
        # (Litestar's) refuses some spellings first (405, 404): refused either way, and the
        # charge count below shows nothing ran.
        assert status in ("400", "404", "405"), f"{method} {target}: {out[:200]!r}"
        if status != "400":
            notes.add(f"{method} {target}: {status} from the router")
    # Spellings the service routes to the keyed route need its key.
    for target in ["/V1/CHARGES", "/v1//charges", "/v1/%63harges"]:
        r = svc.request("POST", target, {**CALLER, **JSON}, body)
        assert r.status == 400 and r.problem() == "key-missing" or r.status == 404, f"{target}: {r!r}"
    delta(0)
    return "; ".join(sorted(notes))


def _raw_status(out: bytes) -> str:
    return out.split(b" ", 2)[1].decode() if out.startswith(b"HTTP/1.") else "?"


def _raw_post(svc: Service, target: str, body: bytes, extra: str = "") -> bytes:
    head = (f"POST {target} HTTP/1.1\r\nHost: t\r\nauthorization: Bearer agent-1\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}connection: close\r\n\r\n")
    return svc.raw(head.encode() + body)


def target_forms(svc: Service):
    """Items 1 and 2 of issue 59: the absolute form (any scheme, userinfo, a port) and a
    fragment are reduced to the path the server routes, so the keyed route needs its key;
    keyed, the absolute form is the same request as the path (one intent, one key). Raw
    sockets: a client library would rewrite these targets."""
    delta = counted(svc)
    body = b'{"customer":"cus_1"}'
    charges = f"{svc.prefix}/v1/charges"
    spellings = [f"http://127.0.0.1{charges}", f"http://127.0.0.1:80{charges}", f"HTTP://x{charges}",
                 f"https://x{charges}", f"ftp://x{charges}", f"x://y{charges}", f"http://u:p@x{charges}",
                 f"http://x/{charges}", f"{charges}#x", f"{charges}#", f"{charges}#?", f"{charges}/#x"]
    for target in spellings:
        out = _raw_post(svc, target, body)
        # 400 (key-missing from idem, or the server's own parser refusing the target) or 404:
        # refused either way, and the count below shows nothing ran.
        assert _raw_status(out) in ("400", "404"), f"{target}: {out[:300]!r}"
    delta(0)
    k = key()
    first = _raw_post(svc, f"http://127.0.0.1{charges}", body, f"idempotency-key: {k}\r\n")
    status = _raw_status(first)
    again = svc.charge(k, raw=body)
    if status == "201":
        assert again.replayed() and again.status == 201, f"the absolute form and the path are one request: {again!r}"
        delta(1)
        return ""
    # Refused where the app would not route it as the path: 400 from idem (uvicorn's h11
    # parser hands the absolute form on as the ASGI path), or 404 from a router that runs
    # before any middleware (Litestar's). Nothing was kept under the key: the path runs once.
    assert status in ("400", "404"), first[:300]
    assert again.status == 201 and not again.replayed(), f"the key was kept for a request that never ran: {again!r}"
    delta(1)
    return f"the absolute form refused ({status}) where the app would not route it"


def empty_credentials(svc: Service):
    """Item 5: an empty credential, or a bare scheme with no token, names no caller."""
    delta = counted(svc)
    for caller in [{"authorization": ""}, {"authorization": "Bearer"}, {"authorization": "Basic "},
                   {"x-api-key": ""}, {"authorization": "", "x-api-key": ""}]:
        is_problem(svc.charge(key(), caller=caller), "principal-missing", 400)
    delta(0)


def short_body(svc: Service):
    """Item 6: a body shorter than its Content-Length (the client half-closed) runs nothing,
    and the key stays free: the full retry runs once."""
    delta, k = counted(svc), key()
    body = b'{"customer":"cus_1","amount_cents":4900}'
    u = urlsplit(svc.base)
    head = (f"POST {svc.prefix}/v1/charges HTTP/1.1\r\nHost: t\r\nauthorization: Bearer agent-1\r\n"
            f"content-type: application/json\r\nidempotency-key: {k}\r\ncontent-length: {len(body)}\r\n\r\n")
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(head.encode() + body[:10])
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
    # 400 body-unreadable, or the connection closed unanswered: the client is gone either way.
    assert out == b"" or _raw_status(out) == "400", out[:300]
    delta(0)
    full = svc.charge(k, raw=body)
    assert full.status == 201 and not full.replayed(), f"the key stayed free: {full!r}"
    delta(1)


def body_trickle(svc: Service):
    """Item 7: a body trickled past ``[timeouts] body_read`` (5 s here): 408 body-timeout,
    nothing runs."""
    delta = counted(svc)
    body = b'{"customer":"cus_1","amount_cents":4900,"pad":"' + b"x" * 40 + b'"}'
    u = urlsplit(svc.base)
    head = (f"POST {svc.prefix}/v1/charges HTTP/1.1\r\nHost: t\r\nauthorization: Bearer agent-1\r\n"
            f"content-type: application/json\r\nidempotency-key: {key()}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")
    out = b""
    with socket.create_connection((u.hostname, u.port), timeout=15) as s:
        s.sendall(head.encode())
        started = time.monotonic()
        try:
            for i in range(len(body)):  # a byte every 0.25 s: 23 s for the whole body
                s.sendall(body[i:i + 1])
                s.settimeout(0.25)
                try:
                    got = s.recv(65536)
                except socket.timeout:
                    continue
                out += got
                break
            s.settimeout(10)
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        elapsed = time.monotonic() - started
    assert _raw_status(out) == "408", f"after {elapsed:.1f} s: {out[:300]!r}"
    delta(0)
    return f"408 after {elapsed:.1f} s"


def gzip_again(svc: Service):
    """Item 9: the same JSON compressed again (gzip stamps its time) is the same request."""
    import gzip
    delta, k = counted(svc), key()
    data = json.dumps({"customer": "cus_1", "amount_cents": 4900}).encode()
    h = {"content-encoding": "gzip"}
    first = svc.charge(k, raw=gzip.compress(data, mtime=1), headers=h)
    assert first.status in (201, 400, 415), first
    again = svc.charge(k, raw=gzip.compress(data, mtime=2), headers=h)
    assert again.replayed() and again.body == first.body, f"a re-compressed retry is the same request: {again!r}"
    # Another body compressed is another request.
    other = svc.charge(k, raw=gzip.compress(b'{"customer":"cus_2"}', mtime=1), headers=h)
    is_problem(other, "key-reused", 422)
    delta(1 if first.status == 201 else 0)
    return "" if first.status == 201 else f"the framework answers a gzip body {first.status}"


def after_response(svc: Service):
    """Item 3: work the framework runs after the response (a background task that sleeps 3 s,
    then raises) neither delays the response nor changes it: it arrives at once, and the
    retry replays it."""
    delta, k = counted(svc), key()
    work = {"customer": "cus_1", "amount_cents": 1, "simulate": "after", "delay_ms": 3000}
    started = time.monotonic()
    first = svc.charge(k, work)
    elapsed = time.monotonic() - started
    assert first.status == 201, first
    # Not a timing bound on speed: the response must not wait for the 3 s of work after it.
    assert elapsed < 2.5, f"the response waited {elapsed:.1f} s for the work after it"
    again = svc.charge(k, work)
    assert again.replayed() and again.status == 201 and again.body == first.body, again
    delta(1)


def endless_response(svc: Service):
    """Item 8: a keyed response that never ends (an event stream) whose client leaves: after
    the lease (2 s here) the key reads as an unknown outcome, not in flight for ever."""
    delta, k = counted(svc), key()
    stream = {"customer": "cus_1", "simulate": "stream"}
    try:
        svc.charge(k, stream, timeout=1)
    except (OSError, http.client.HTTPException):
        pass
    until(lambda: delta_is(svc, delta, 1), "the stream to charge")

    def settled() -> bool:
        r = svc.charge(k, stream, timeout=5)
        return r.status == 409 and r.problem() == "outcome-unknown"

    until(settled, "the abandoned stream to settle as outcome-unknown", 15)
    delta(1)


def crash(svc: Service):
    """SIGKILL mid-request (after the charge, before the answer): the key is abandoned, visible
    in ``idem inspect``, and a retry gets ``outcome-unknown``, never a second run."""
    delta, k = counted(svc), key()
    slow = {"customer": "cus_1", "simulate": "slow", "delay_ms": 30000}
    first = in_background(lambda: svc.charge(k, slow, timeout=60))
    until(lambda: delta_is(svc, delta, 1), "the request to charge")
    svc.crash_and_restart()
    try:
        first()
    except (ConnectionError, http.client.HTTPException, OSError):
        pass
    # The lease (2 s) ends with no heartbeat to extend it.
    time.sleep(2.5)
    # Past the slow body's 30 s: a front end that ran it again shows in the charge count,
    # not as a client timeout.
    retry = svc.charge(k, slow, timeout=45)
    is_problem(retry, "outcome-unknown", 409)
    shown = svc.inspect(k, "authorization: Bearer agent-1")
    assert "abandoned" in shown, shown
    delta(1)


def store_unavailable(svc: Service):
    """The store cut off: 503 ``store-unavailable``, nothing runs; back, requests run again."""
    assert svc.cut is not None
    delta = counted(svc)
    svc.cut(True)
    try:
        is_problem(svc.charge(key()), "store-unavailable", 503)
    finally:
        svc.cut(False)
    delta(0)

    def back() -> bool:
        try:
            return svc.charge(key()).status == 201
        except OSError:
            return False

    until(back, "the store to come back", 30)


def stripe_envelope(svc: Service):
    """Under ``[problems] format = "stripe"``: refusals in Stripe's envelope and statuses."""
    delta, k = counted(svc), key()
    svc.charge(k)
    reused = svc.charge(k, {"customer": "cus_1", "amount_cents": 1})
    assert reused.status == 400 and reused.header("stripe-should-retry") == "false", reused
    err = reused.json()["error"]
    assert (err["type"], err["code"]) == ("idempotency_error", "key-reused"), err
    missing = svc.charge(None)
    assert missing.status == 400 and missing.json()["error"]["type"] == "invalid_request_error", missing
    delta(1)


@dataclass
class Case:
    name: str
    run: Callable[[Service], Optional[str]]
    summary: str
    variant: str = "default"
    #: The front ends whose example service has what the case needs (an event stream);
    #: empty: every front end.
    only: Tuple[str, ...] = ()


CASES: List[Case] = [
    Case("key-missing", key_missing, "no key on a route that requires one: 400 key-missing, nothing runs"),
    Case("key-invalid", key_invalid, "a malformed, over-long, empty or repeated key: 400 key-invalid"),
    Case("replay", replay, "a repeated key replays status, headers and body with Idempotent-Replayed; reordered JSON is the same request"),
    Case("key-reused", key_reused, "the key with another body, path or media type: 422 key-reused"),
    Case("in-flight", in_flight, "a duplicate while the first runs: 409 in-flight with Retry-After; another body: 422 first"),
    Case("waits", waits, "on a route with wait, the duplicate waits and gets the first's result"),
    Case("concurrent", concurrent_duplicates, "16 concurrent duplicates: one execution, 16 equal answers"),
    Case("pass-through", safe_and_unkeyed_pass, "safe methods and routes that require no key pass through; a key there is honoured"),
    Case("caller-scopes", callers_are_scoped, "another caller's identical key is its own"),
    Case("anonymous-refused", anonymous_refused, "a keyed request naming no caller: 400 principal-missing"),
    Case("cookies-own-scope", cookies_stay_with_their_caller, "a caller's Set-Cookie is replayed to that caller"),
    Case("cookies-anonymous", anonymous_scope_withholds_cookies, "anonymous = allow: Set-Cookie never replayed in the shared scope", "anonymous"),
    Case("body-bound", body_bound, "a body over the bound: 413 body-too-large, nothing runs"),
    Case("handler-raises", handler_raises, "a handler that raises after its effect: never released (outcome-unknown, or the framework's 500 kept)"),
    Case("status-policy", kept_and_released_statuses, "a 5xx is kept and replayed; a 429 releases the key"),
    Case("large-response", large_response, "a response over the stored bound: whole once, then 409 response-too-large"),
    Case("spellings", request_spellings, "a lower-case method or a dot segment: 400; other spellings of the keyed route need its key"),
    Case("target-forms", target_forms, "the absolute form (any scheme, userinfo) and a #fragment are the path the server routes: the keyed route needs its key"),
    Case("empty-credentials", empty_credentials, "an empty credential or a bare auth scheme names no caller: 400 principal-missing"),
    Case("short-body", short_body, "a body shorter than its Content-Length: nothing runs, the key stays free"),
    Case("body-trickle", body_trickle, "a body trickled past [timeouts] body_read: 408 body-timeout, nothing runs"),
    Case("gzip-again", gzip_again, "the same JSON gzipped again (another mtime) replays; another body is key-reused"),
    Case("after-response", after_response, "work after the response (a background task that sleeps, then raises): the response arrives at once and replays"),
    Case("endless-response", endless_response, "a response that never ends, its client gone: outcome-unknown after the lease, not in flight for ever", only=("express", "express4", "express-mounted", "fastify", "hono")),
    Case("crash", crash, "SIGKILL mid-request: abandoned (idem inspect), the retry gets outcome-unknown"),
    Case("store-down", store_unavailable, "the store cut off: 503 store-unavailable, nothing runs", "relay"),
    Case("stripe-envelope", stripe_envelope, "[problems] format = stripe: Stripe's envelope and statuses", "stripe"),
]
