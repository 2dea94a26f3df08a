"""Durable facts of Canopy: schema, connection pool and scoped repositories.

This package imports nothing from the other Canopy packages; everything above it
(actors, sandbox, api) reaches PostgreSQL through the repositories here.
"""
