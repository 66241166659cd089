"""The example payment service on Flask, made idempotent by the WSGI middleware:

    gunicorn flask_app:app -b 127.0.0.1:3000 --threads 8

$IDEM_CONFIG names idem's TOML file (``off``: the service runs bare); $LEDGER the file of
charges (ledger.py says what it serves).
"""

import os

from flask import Flask, jsonify, request

from idem_runtime.wsgi import IdempotencyMiddleware

import ledger

app = Flask(__name__)
if os.environ.get("IDEM_CONFIG") != "off":
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, config=os.environ.get("IDEM_CONFIG", "idem.toml"))


@app.post("/v1/charges")
@app.post("/v1/waits")
def create_charge():
    f = ledger.fields(request.get_data(), request.content_type)
    status, body, headers = ledger.charge(f)
    resp = jsonify(body)
    resp.status_code = status
    for name, value in headers:
        resp.headers[name] = value
    resp.call_on_close(lambda: ledger.after(f))
    return resp


@app.get("/v1/charges")
def charges():
    return {"count": ledger.count()}


@app.post("/v1/echo")
def echo():
    return {"echo": request.get_data(as_text=True)}
