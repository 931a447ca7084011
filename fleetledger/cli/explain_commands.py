"""Commands: explain (issue 3, forensics)."""
