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
from pathlib import Path
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


def mask(obj: Any, hide=lambda value: HIDDEN if value else value) -> Any:
    """A copy of obj (mappings and lists, any depth) with the value of every secret-named key hidden: a text, or
    each text of a list (``tokens: [a, b]``); `hide` makes what stands in its place (keyed_secrets: keyed)."""
    if isinstance(obj, dict):
        return {k: (_hide(v, hide) if secret_name(k) else mask(v, hide)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask(v, hide) for v in obj]
    return obj


def _hide(value: Any, hide) -> Any:
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, list):
        return [_hide(v, hide) for v in value]
    return mask(value, hide)


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """A longctx config fit to pass, log or print: every configuration's env values hidden but those
    report.env_shown names, its URL's user, password and secret query values (mask_url), a secret flag's word and a
    secret KEY=VALUE word in extra_args and command (mask_argv), and every secret-named value elsewhere (mask). The one redaction every path uses (the
    workflow's params, `longctx render --configfile`, the report's config listing); idempotent."""
    import copy

    shown = set((config.get("report") or {}).get("env_shown") or ())
    out = mask(copy.deepcopy(config))
    for name, conf in (out.get("configurations") or {}).items():
        if conf.get("url"):
            conf["url"] = mask_url(conf["url"])
        if conf.get("env"):
            conf["env"] = {k: (v if k in shown else HIDDEN) for k, v in config["configurations"][name]["env"].items()}
        for words in ("extra_args", "command"):  # the words that start the server, too (vllm's command)
            if conf.get(words):
                conf[words] = mask_argv(conf[words])
    return out


def mask_argv(words: list[str] | None, hide=lambda value: HIDDEN) -> list[str] | None:
    """A command line with the value of every secret-named flag hidden (``--api-key K`` and ``--api-key=K``), and of
    every secret-named ``KEY=VALUE`` word (``--config hf_token=K``); `hide` makes what stands in its place (keyed, for
    a digest that must still tell two values apart)."""
    if words is None:
        return None
    out: list[str] = []
    hide_next = False
    for word in map(str, words):
        if hide_next and not word.startswith("--"):
            out.append(hide(word))
            hide_next = False
            continue
        hide_next = False
        flag, eq, value = word.partition("=")
        if word.startswith("-"):
            if secret_name(flag):
                if eq:
                    word = f"{flag}={hide(value)}"
                else:
                    hide_next = True
        elif eq and flag and secret_name(flag):
            word = f"{flag}={hide(value)}"
        out.append(word)
    return out


KEY_FILE = Path(".longctx") / "hash-key"  # in the workflow's directory (a cluster's nodes share it), mode 0600


def keyed(value: str, key_file: str | Path | None = None) -> str:
    """What stands for a secret value in an identity digest (a spec's hash, its resume key): an HMAC-SHA256 of it
    under this workflow directory's own key (KEY_FILE, made once, readable by its owner only, never written
    elsewhere), so that a changed value still changes the digest, but no one who sees the digest (a raw file, a
    version record, Snakemake's records) can test guesses of the value against it. Empty stays empty."""
    import hashlib
    import hmac
    import os
    import secrets as _secrets

    if not value:
        return value
    path = Path(key_file) if key_file else KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:  # made whole, then linked in place: two processes that race keep the first one's
        path.parent.mkdir(parents=True, exist_ok=True)
        made = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, _secrets.token_bytes(32))
        finally:
            os.close(fd)
        try:
            os.link(made, path)
        except FileExistsError:
            pass
        finally:
            made.unlink()
        key = path.read_bytes()
    return "hmac:" + hmac.new(key, str(value).encode(), hashlib.sha256).hexdigest()[:16]


def keyed_secrets(obj: Any) -> Any:
    """A copy of obj with every secret-named key's text keyed (mask's rule, keyed in place of hidden)."""
    return mask(obj, keyed)


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
