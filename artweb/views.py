from django.db import connection
from django.http import JsonResponse


def healthz(request):
    """Liveness and readiness: answers 200 only when the database and Redis both answer."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure is reported, not raised: this is a probe
        checks["database"] = f"error: {exc.__class__.__name__}"
    try:
        from django.core.cache import cache

        cache.set("artweb:healthz", "1", 5)
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {exc.__class__.__name__}"
    ok = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if ok else "error", **checks}, status=200 if ok else 503)
