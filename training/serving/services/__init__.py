"""The serving app's writes: a request's trip to a serving worker (`serving`), checkpoint aliases
(`aliases`), playground sessions and answer diffs (`serve_jobs`)."""
