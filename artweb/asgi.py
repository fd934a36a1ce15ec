"""ASGI entry: Django for HTTP (behind the request-size limit), Channels consumers for WebSockets
(same-origin only, session-authenticated)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry loaded)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402
from django.template.loader import get_template  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from artweb.request_size import RequestSizeLimit  # noqa: E402
from artweb.routing import websocket_urlpatterns  # noqa: E402

# What Django otherwise does on a process's first request, done as the server starts: import every view
# module behind the URLconf (about 140 ms on two cores) and compile the pages every visitor sees first.
_patterns = get_resolver().url_patterns
for _name in ("base.html", "registration/login.html"):
    get_template(_name)


class SameOriginValidator:
    """Lets a WebSocket handshake through only from a page of this site: an Origin equal in scheme, host
    and port to the connection's own (its Host header, one of ALLOWED_HOSTS, with http for ws and https
    for wss), or one listed in CSRF_TRUSTED_ORIGINS.

    Channels' AllowedHostsOriginValidator compares host names only, so a page served from another port
    of the same host (another user's program, a development server) could open a signed-in user's
    sockets: the browser sends the session cookie whatever the port.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        # Django's `https://*.example.com` is Channels' `https://.example.com` (the domain and its subdomains).
        allowed = [origin.replace("://*.", "://.", 1) for origin in settings.CSRF_TRUSTED_ORIGINS]
        host = dict(scope.get("headers") or ()).get(b"host", b"").decode("latin-1")
        if host and validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
            allowed.append(f"{'https' if scope.get('scheme') == 'wss' else 'http'}://{host}")
        # OriginValidator compares scheme, host and port (a missing port is the scheme's default).
        return await OriginValidator(self.app, allowed)(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": RequestSizeLimit(django_asgi_app),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
