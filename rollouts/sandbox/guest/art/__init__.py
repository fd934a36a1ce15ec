"""`import art` inside artweb's sandbox: the artweb SDK under ART's name."""

from artweb_sdk import *  # noqa: F403 - `art` is the SDK under ART's name
from artweb_sdk import __all__  # noqa: F401

# ART scripts reach RULER as `art.rewards.ruler_score_group` after a plain `import art`.
from . import rewards as rewards
