"""One router per resource: runs, worker reports, catalog, health."""
