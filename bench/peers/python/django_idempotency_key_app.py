"""The example payment service on Django, made idempotent by django-idempotency-key (PyPI
``django-idempotency-key``), set up from its README: ``IdempotencyKeyMiddleware`` (every
non-safe method requires a key unless its view opts out), the persistent ``CacheKeyStorage``
on a Redis cache (django-redis, a dependency of the package), and its cross-process
``MultiProcessRedisLock`` (the README's ThreadLock "should be used only when there is one
process").

    gunicorn django_idempotency_key_app:application -b 127.0.0.1:3000

``/v1/echo`` is marked ``@idempotency_key(optional=True)``: a key there is honoured, none is
required, as the suite's configuration has it. What the library cannot be told: a caller
(its key encoder does hash the Authorization header in, so callers with different
credentials get different records).
"""

from django.conf import settings

import peer_env
from peer_env import ledger

REDIS = peer_env.redis_url()

settings.configure(
    DEBUG=False,
    SECRET_KEY="example-only",
    ROOT_URLCONF=__name__,
    ALLOWED_HOSTS=["*"],
    MIDDLEWARE=["idempotency_key.middleware.IdempotencyKeyMiddleware"],
    CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS, "KEY_PREFIX": peer_env.prefix()}},
    IDEMPOTENCY_KEY={
        # Defaults otherwise: header Idempotency-Key, a replay answered 409 with the stored
        # body (CONFLICT_STATUS_CODE), 2xx stored, lock timeout 0.1 s (then 423).
        "STORAGE": {"CLASS": "idempotency_key.storage.CacheKeyStorage", "CACHE_NAME": "default"},
        "LOCK": {"CLASS": "idempotency_key.locks.redis.MultiProcessRedisLock", "LOCATION": REDIS,
                 "NAME": f"{peer_env.prefix()}:lock"},
    },
)

import django  # noqa: E402

django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402
from idempotency_key.decorators import idempotency_key  # noqa: E402


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


@idempotency_key(optional=True)
@csrf_exempt
def echo(request):
    return JsonResponse({"echo": request.body.decode()})


urlpatterns = [
    path("v1/charges", create_charge),
    path("v1/waits", create_charge),
    path("v1/echo", echo),
]

application = get_wsgi_application()
