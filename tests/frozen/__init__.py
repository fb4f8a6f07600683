"""Frozen copies of earlier implementations: the references of the oracle tests (never edited)."""
