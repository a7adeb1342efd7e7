"""The `gradients` assignment: its spec, reference solution and tests."""
