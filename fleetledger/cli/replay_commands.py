"""Commands: replay (issue 3, forensics)."""
