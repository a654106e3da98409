"""Secrets stay where they were given: what masks them before anything is written or shown.

A value is secret when its key (a config key, an environment variable, a server's info field) or
its flag (``--api-key KEY``, ``--hf-token=KEY``) is named like a secret: a word of the name (split at
``_``, ``-`` and ``.``) is token, secret, password, passwd, pass, passphrase, credential(s), session, cookie or bearer,
or two of its words make apikey, accesskey, privatekey or secretkey (api-key, ACCESS_KEY, private_key), or its first
word is auth or authorization. Only a text value is hidden (kv_bytes_per_token is a number). A key ending in ``_env`` names an environment variable, not a value
(``api_key_env: LONGCTX_API_KEY``), and is shown. Where the secret's value itself is known (the API key
read at run time), ``scrub`` removes it from any text as well.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

HIDDEN = "(hidden)"
_WORDS = re.compile(r"[_.\-]+")
_SECRET_WORDS = {"token", "secret", "password", "passwd", "pass", "passphrase", "credential", "credentials", "apikey",
                 "accesskey", "privatekey", "secretkey", "session", "cookie", "bearer"}


def secret_name(name: str) -> bool:
    """Whether a key, variable or flag of this name holds a secret (see the module's note)."""
    name = str(name).lstrip("-").lower()
    if name.endswith("_env"):
        return False
    words = [w for w in _WORDS.split(name) if w]
    joined = ["".join(words[i:i + 2]) for i in range(len(words) - 1)]  # api-key -> apikey
    return bool(words) and (words[0] in ("auth", "authorization") or any(w in _SECRET_WORDS for w in words + joined))


def mask(obj: Any) -> Any:
    """A copy of obj (mappings and lists, any depth) with the value of every secret-named key hidden: a text, or
    each text of a list (``tokens: [a, b]``)."""
    if isinstance(obj, dict):
        return {k: (_hide(v) if secret_name(k) else mask(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask(v) for v in obj]
    return obj


def _hide(value: Any) -> Any:
    if isinstance(value, str):
        return HIDDEN if value else value
    if isinstance(value, list):
        return [_hide(v) for v in value]
    return mask(value)


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """A longctx config fit to pass, log or print: every configuration's env values hidden but those
    report.env_shown names, its URL's user, password and secret query values (mask_url), a secret flag's word in
    extra_args (mask_argv), and every secret-named value elsewhere (mask). The one redaction every path uses (the
    workflow's params, `longctx render --configfile`, the report's config listing); idempotent."""
    import copy

    shown = set((config.get("report") or {}).get("env_shown") or ())
    out = mask(copy.deepcopy(config))
    for name, conf in (out.get("configurations") or {}).items():
        if conf.get("url"):
            conf["url"] = mask_url(conf["url"])
        if conf.get("env"):
            conf["env"] = {k: (v if k in shown else HIDDEN) for k, v in config["configurations"][name]["env"].items()}
        if conf.get("extra_args"):
            conf["extra_args"] = mask_argv(conf["extra_args"])
    return out


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


def url_parts(url: str | None) -> tuple[str | None, str | None, str | None]:
    """(the URL without its userinfo, the user, the password) of ``http://user:pass@host:port/path``."""
    if not url:
        return url, None, None
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc)), parts.username, parts.password


def mask_url(url: str | None) -> str | None:
    """A URL fit to write or show: its userinfo hidden (``http://(hidden)@host``), and the value of every query
    parameter named like a secret (``?token=…``, ``?api_key=…``)."""
    if not url:
        return url
    clean, user, password = url_parts(url)
    parts = urlsplit(clean)
    if user is not None or password is not None:
        parts = parts._replace(netloc=f"{HIDDEN}@{parts.netloc}")
    if parts.query:
        query = [(k, HIDDEN if secret_name(k) or k.lower() in ("key", "sig", "signature") else v)
                 for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        parts = parts._replace(query=urlencode(query, safe="()"))
    return urlunsplit(parts)
