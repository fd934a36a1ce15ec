"""`art.rewards` inside artweb's sandbox: RULER, with ART's names and signatures (see artweb_sdk.ruler)."""

from artweb_sdk.ruler import DEFAULT_RUBRIC, RulerError, TrajectoryScore, ruler, ruler_score_group

__all__ = ["DEFAULT_RUBRIC", "RulerError", "TrajectoryScore", "ruler", "ruler_score_group"]
