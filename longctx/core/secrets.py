"""Secrets stay where they were given: what masks them before anything is written or shown.

A value is secret when its key (a config key, an environment variable, a server's info field) or
its flag (``--api-key KEY``, ``--hf-token=KEY``) is named like a secret: a word of the name (split at
``_``, ``-`` and ``.``) is token, secret, password, passwd, pass, passphrase, apikey (api key, api-key) or credential(s),
or its first word is auth or authorization. Only a text value is hidden (kv_bytes_per_token is a number). A key ending in ``_env`` names an environment variable, not a value
(``api_key_env: LONGCTX_API_KEY``), and is shown. Where the secret's value itself is known (the API key
read at run time), ``scrub`` removes it from any text as well.
"""

from __future__ import annotations

import re
from typing import Any

HIDDEN = "(hidden)"
_WORDS = re.compile(r"[_.\-]+")
_SECRET_WORDS = {"token", "secret", "password", "passwd", "pass", "passphrase", "credential", "credentials", "apikey"}


def secret_name(name: str) -> bool:
    """Whether a key, variable or flag of this name holds a secret (see the module's note)."""
    name = str(name).lstrip("-").lower()
    if name.endswith("_env"):
        return False
    words = [w for w in _WORDS.split(name) if w]
    joined = ["".join(words[i:i + 2]) for i in range(len(words) - 1)]  # api-key -> apikey
    return bool(words) and (words[0] in ("auth", "authorization") or any(w in _SECRET_WORDS for w in words + joined))


def mask(obj: Any) -> Any:
    """A copy of obj (mappings and lists, any depth) with the value of every secret-named key hidden."""
    if isinstance(obj, dict):
        return {k: (HIDDEN if secret_name(k) and isinstance(v, str) and v else mask(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask(v) for v in obj]
    return obj


def mask_argv(words: list[str] | None) -> list[str] | None:
    """A command line with the value of every secret-named flag hidden (``--api-key K`` and ``--api-key=K``)."""
    if words is None:
        return None
    out: list[str] = []
    hide_next = False
    for word in map(str, words):
        if hide_next and not word.startswith("--"):
            out.append(HIDDEN)
            hide_next = False
            continue
        hide_next = False
        if word.startswith("-"):
            flag, eq, _ = word.partition("=")
            if secret_name(flag):
                if eq:
                    word = f"{flag}={HIDDEN}"
                else:
                    hide_next = True
        out.append(word)
    return out


def scrub(text: str, *values: str | None) -> str:
    """text with every occurrence of the given secret values replaced (values shorter than 4 characters are
    left: they would hide ordinary words)."""
    for value in values:
        if value and len(value) >= 4:
            text = text.replace(value, HIDDEN)
    return text
