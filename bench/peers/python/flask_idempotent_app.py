"""The example payment service on Flask, made idempotent by Flask-Idempotent (PyPI
``flask-idempotent``), set up as its README says (``Idempotent(app)``, Redis at
``REDIS_URL``, the default 240 s expiry) with the one suite setting it has: the /v1/waits
route's 10 s wait (``IDEMPOTENT_TIMEOUT``, global here: no per-route wait, no route that
answers a duplicate at once).

    gunicorn flask_idempotent_app:app -b 127.0.0.1:3000 --threads 16

The README names only an ``X-Idempotent-Key`` header (or an ``__idempotent_key`` form field);
the extension's ``key_finder`` hook (in its code, not its README) adds the suite's
``Idempotency-Key`` header. It covers every request that carries a key, whatever its method
or path; it cannot be told to require one, nor who the caller is.

It needs Flask < 3 and Jinja2 < 3.1 (it imports ``flask._request_ctx_stack`` and
``jinja2.Markup``) and ``six``, which it does not declare: requirements.txt pins those.
"""

from flask import Flask, jsonify, request
from flask_idempotent import Idempotent

import peer_env
from peer_env import ledger

app = Flask(__name__)
app.config["REDIS_URL"] = peer_env.redis_url()
app.config["IDEMPOTENT_TIMEOUT"] = 10
idempotent = Idempotent(app)
# The key, in this run's namespace (the extension has no prefix setting of its own).
idempotent.key_finder(lambda req: req.headers.get("Idempotency-Key") and peer_env.prefix() + ":" + req.headers["Idempotency-Key"])


@app.post("/v1/charges")
@app.post("/v1/waits")
def create_charge():
    f = ledger.fields(request.get_data(), request.content_type)
    status, body, headers = ledger.charge(f)
    resp = jsonify(body)
    resp.status_code = status
    for name, value in headers:
        resp.headers[name] = value
    return resp


@app.get("/v1/charges")
def charges():
    return {"count": ledger.count()}


@app.post("/v1/echo")
def echo():
    return {"echo": request.get_data(as_text=True)}
