"""The errors a user of `python -m zoo.train` fixes by changing the command."""


class UserError(ValueError):
    """A problem with the command, its configuration or its files; printed as one line."""


class ConfigError(UserError):
    """A configuration value or override the user has to fix."""
