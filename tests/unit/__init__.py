"""Fast tests with no real MPI, Docker engine or testbed: `pytest tests/unit` is the inner loop (CONTRIBUTING.md)."""
