"""Commands: timeline (issue 3, forensics)."""
