"""The base of every settings model (unknown keys are errors, values are frozen), and the check every key passes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, SecretStr


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def usable_key(value: SecretStr | None) -> SecretStr | None:
    """A key that is empty or whitespace (an unset template variable) would open what it guards, and one with
    surrounding whitespace (a newline from a key file) can never be presented: both are refused."""
    if value is None:
        return None
    secret = value.get_secret_value()
    if not secret.strip():
        raise ValueError("must not be empty or only whitespace (an unset variable?); set a key or remove the setting")
    if secret != secret.strip():
        raise ValueError("must not begin or end with whitespace (a newline from a key file?); no client can send it")
    return value
