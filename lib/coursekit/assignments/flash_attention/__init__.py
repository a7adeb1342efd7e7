"""The `flash-attention` assignment: its spec, reference solution and tests."""
