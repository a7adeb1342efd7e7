"""The course kit of 'Softmax in Attention': assignments, a sandboxed grader, exports."""
