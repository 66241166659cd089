"""The example payment service on Django, one file, made idempotent by the ASGI middleware
around Django's ASGI application (``application``) or the WSGI one around its WSGI
application (``wsgi_application``):

    uvicorn django_app:application --port 3000
    gunicorn django_app:wsgi_application -b 127.0.0.1:3000
"""

import os

from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="example-only",
    ROOT_URLCONF=__name__,
    ALLOWED_HOSTS=["*"],
    MIDDLEWARE=[],
)

import django  # noqa: E402

django.setup()

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from idem_runtime import asgi, wsgi  # noqa: E402

import ledger  # noqa: E402


@csrf_exempt
def create_charge(request):
    if request.method == "GET":
        return JsonResponse({"count": ledger.count()})
    f = ledger.fields(request.body, request.content_type)
    status, body, headers = ledger.charge(f)
    resp = JsonResponse(body, status=status)
    for name, value in headers:
        resp[name] = value
    return resp


@csrf_exempt
def echo(request):
    return JsonResponse({"echo": request.body.decode()})


urlpatterns = [
    path("v1/charges", create_charge),
    path("v1/waits", create_charge),
    path("v1/echo", echo),
]

CONFIG = os.environ.get("IDEM_CONFIG", "idem.toml")
application = get_asgi_application()
wsgi_application = get_wsgi_application()
if CONFIG != "off":  # off: the service runs bare
    application = asgi.IdempotencyMiddleware(application, config=CONFIG)
    wsgi_application = wsgi.IdempotencyMiddleware(wsgi_application, config=CONFIG)
