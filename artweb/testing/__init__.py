"""What the tests and the benchmarks share, as django.test is to Django's own: starting the real parts
(web server, workers, browser), the default model's weights and adapters for it, and row factories.

Only tests/ and bench/ import it; product code never does (tests/artweb/test_architecture.py).
"""
