"""Analysis tools used by tests and experiments, not by the algorithms (oracles, theory checks)."""
