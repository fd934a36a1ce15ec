"""Plotly's JavaScript, served from the plotly Python package itself (no CDN: works offline).

The URL carries plotly's version, so the file can be cached for a year and a plotly upgrade changes
the URL. The bytes and their gzip are built once per process.
"""

import gzip
from functools import lru_cache

import plotly
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET

ONE_YEAR = 365 * 24 * 3600


def plotly_url() -> str:
    return reverse("plotly-js", args=[plotly.__version__])


@lru_cache(maxsize=1)
def _plotly_bytes() -> tuple[bytes, bytes]:
    from plotly.offline import get_plotlyjs

    raw = get_plotlyjs().encode("utf-8")
    return raw, gzip.compress(raw, compresslevel=9, mtime=0)


@require_GET
def plotly_js(request, version: str):
    if version != plotly.__version__:
        raise Http404("Unknown plotly version.")
    raw, packed = _plotly_bytes()
    use_gzip = "gzip" in request.headers.get("Accept-Encoding", "")
    response = HttpResponse(packed if use_gzip else raw, content_type="text/javascript; charset=utf-8")
    if use_gzip:
        response["Content-Encoding"] = "gzip"
    response["Vary"] = "Accept-Encoding"
    response["Cache-Control"] = f"public, max-age={ONE_YEAR}, immutable"
    return response
