"""The REST API for uploads: rollout scripts, reward functions and scenario sets (see api_urls.py)."""
