"""Database layer: tables, engine setup and Alembic migrations applied at startup."""
