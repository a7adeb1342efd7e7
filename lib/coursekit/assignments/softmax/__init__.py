"""The `softmax` assignment: its spec, reference solution and tests."""
