"""The settings of the test suite and of the servers and workers it starts: artweb.settings, with a fast
password hasher first.

Django's PBKDF2 takes about 0.4 s a password on two cores, and nearly every test creates a persona or
signs one in. New passwords are hashed with MD5 here; the production hashers stay listed, so hashes made
by them still verify. For tests only: no deployment names this module.
"""

from django.conf import global_settings

from artweb.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *global_settings.PASSWORD_HASHERS]
