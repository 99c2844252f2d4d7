"""Example handlers and fixtures used by the shipped tables, the demo and the docs."""
