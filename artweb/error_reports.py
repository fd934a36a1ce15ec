"""Error reports that never show the password of a URL (REDIS_URL, CELERY_BROKER_URL, DATABASE_URL, ...).

Django's SafeExceptionReporterFilter hides a setting whose *name* looks secret (KEY, PASSWORD, TOKEN, ...);
a URL with credentials under any other name, or in a local variable or an exception's message, is shown
as it is. The filter here also masks the password of every URL it meets in settings, request data and
frame variables, and the reporter masks whatever is left in the finished page or text, so an
exception's message that quotes a URL is covered too. Used with DEBUG on or off (settings
DEFAULT_EXCEPTION_REPORTER / DEFAULT_EXCEPTION_REPORTER_FILTER); the log handler masks the lines it
writes the same way.
"""

from __future__ import annotations

import logging
import re

from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

MASK = "********"

# scheme://user:password@ : the password runs to the last "@" before the host (characters that cannot
# be in one, such as whitespace, quotes and markup, end it).
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@'\"<>]*:)[^\s'\"<>]*@")


def mask_url_passwords(text: str) -> str:
    """Every `scheme://user:password@host` in text as `scheme://user:********@host`."""
    return _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)


def _masked(value):
    if isinstance(value, str):  # a lazy string (the CSRF token) too: compared as the text it stands for
        text = str(value)
        masked = mask_url_passwords(text)
        return value if masked == text else masked
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if type(value) in (list, tuple):  # not subclasses (a namedtuple takes other arguments): the page is masked
        return type(value)(_masked(v) for v in value)
    return value


class UrlMaskingReporterFilter(SafeExceptionReporterFilter):
    def cleanse_setting(self, key, value):
        return _masked(super().cleanse_setting(key, value))

    def get_post_parameters(self, request):
        return _masked(super().get_post_parameters(request))

    def get_traceback_frame_variables(self, request, tb_frame):
        # Variables by name too (a local `settings_dict` with its PASSWORD, a `password` argument).
        return [
            (name, self.cleanse_setting(name, value))
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]


class UrlMaskingStreamHandler(logging.StreamHandler):
    """The log handler (settings.LOGGING): a message or traceback that quotes a URL (a connection error
    naming the broker) is written with the URL's password masked, whatever the formatter."""

    def format(self, record):
        return mask_url_passwords(super().format(record))


class UrlMaskingExceptionReporter(ExceptionReporter):
    def get_traceback_html(self):
        return mask_url_passwords(super().get_traceback_html())

    def get_traceback_text(self):
        return mask_url_passwords(super().get_traceback_text())
