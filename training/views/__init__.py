"""Web pages of the training app: runs, launch, compare, trajectories, models, checkpoints.

Views are thin: read through selectors, write through services, and turn ApplicationError into an
inline form error or a flash message.
"""
