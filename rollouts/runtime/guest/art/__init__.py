"""`import art` inside artweb's sandbox: the artweb SDK under ART's name."""

from artweb_sdk import *
from artweb_sdk import __all__  # noqa: F401
