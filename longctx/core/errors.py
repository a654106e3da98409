"""Errors meant for people, shared by every stage."""


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which key and what is allowed."""
