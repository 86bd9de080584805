"""Runtimes: `local` (every role in this process) and `distributed` (one process per role)."""
