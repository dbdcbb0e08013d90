"""Tessera's control plane: REST API, database, state machine, and the dispatcher that follows Ray jobs.

Imports api, FastAPI, SQLAlchemy, alembic, pydantic and Ray's job-submission client only;
never torch, ``workers`` or ``algorithms`` (a test enforces it), so it runs in a small image.
"""
