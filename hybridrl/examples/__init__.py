"""Runnable demonstrations built from the project's entry points (`python -m hybridrl.examples.<name>`)."""
