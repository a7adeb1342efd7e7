"""The `sparse-maps` assignment: its spec, reference solution and tests."""
