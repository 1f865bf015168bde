"""Tests of credentials against real identity servers (Keycloak)."""
