"""Alembic migrations, applied by ``service.db.engine.migrate`` at startup."""
