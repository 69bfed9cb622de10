"""Launchers: the interface, the registry and the built-in platforms."""
