"""The guest program's parts, run only inside the sandbox process (its entry, _artweb_guest.py, puts the
directory above on sys.path): user_code, results, batch, scoring and relay."""
