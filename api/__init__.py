"""Tessera's contract: specs, catalog, views and the client SDK. Imports pydantic and httpx only."""
