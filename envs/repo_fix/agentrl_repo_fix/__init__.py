"""repo_fix: fix a synthesized bug in a real Python package, graded by its own test suite."""
