"""The actor tests use the session-scoped ``runtime`` fixture of tests/conftest.py (a real local
Ray with the Canopy runtime on the test database), shared with the API tests."""
