"""`art.langgraph`: ART's LangGraph integration (artweb_sdk.langgraph)."""

from artweb_sdk.langgraph import init_chat_model, wrap_rollout

__all__ = ["init_chat_model", "wrap_rollout"]
