"""Test backends: ways to get a Pravega controller URI for the suite (real Pravega standalone here)."""
