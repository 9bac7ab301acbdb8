"""Clients of outside services (OpenAI-compatible endpoints)."""
