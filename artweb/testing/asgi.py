"""The project's ASGI application with static files served, for tests and the page benchmark.

artweb.asgi leaves /static/ to the deployment (a proxy or WhiteNoise); a test server has neither, so
this wraps the HTTP side in Django's static files handler, as runserver does in development.
"""

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from artweb import asgi

application = asgi.ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(asgi.django_asgi_app),
        "websocket": asgi.application.application_mapping["websocket"],
    }
)
