"""The configuration spec: everything the bench job of one configuration needs, and nothing of the
other configurations. longctx.config.configuration_spec cuts it from the validated config; the
workflow passes it as canonical JSON (rule bench_configuration, `longctx bench --spec`); the sweep
(longctx.measure.sweep) and every engine adapter read it.

It is defined with the adapter interface, the earliest stage that both the config and the sweep
import, and its dictionary form with every secret value keyed (hashable) is the one the raw files' spec_hash and
resume_key are computed over.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any
from urllib.parse import unquote

from ..core.hashing import canonical_json, digest
from ..core.secrets import keyed, keyed_secrets, mask, mask_argv, mask_url, url_parts

# protocol keys that do not make two measurements unlike (ConfigurationSpec.settings)
# what ConfigurationSpec.settings records: 2 since they hold no secret's value (env names, not values; the URL masked)
SETTINGS_SCHEME = 2
SETTINGS_PROTOCOL_LEFT_OUT = ("trials", "warmup", "request_timeout_s", "timeout_factor", "itl_depth", "needle", "concurrency")


def _dotted(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested dict as one level of dotted keys; lists as they are."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@dataclass(frozen=True)
class ConfigurationSpec:
    """One configuration as its bench job runs it (config/schema.yaml describes each key).

    Its fields: the configuration's name and engine, what the job takes from the rest of the config
    (lengths, protocol, server, telemetry, model), then the configuration's other keys
    (configurations.<name> less `resources`, which only schedules the job) and its kernel's build.
    Frozen: a field is not rebound (`dataclasses.replace` makes a changed copy); the sections are
    the config's plain dicts."""

    name: str  # the key of configurations
    engine: str  # reference | sglang | vllm | external | imported (longctx.engines.get_adapter)
    lengths: list[int]  # prompt lengths in tokens, in the order measured
    protocol: dict[str, Any]  # config key protocol: warm-up, trials, output tokens, needle, itl_depth, timeouts
    server: dict[str, Any]  # config key server: host, start-up and stop timeouts, restarts
    telemetry: dict[str, Any]  # config key telemetry: on/off, sampling interval, NVML devices
    model: dict[str, Any]  # config key model: name, path, seed, hf_config, architecture, kv_bytes_per_token
    kernel: str | None = None  # a key of kernels, or None
    kernel_build: str | None = None  # the build directory of that kernel (build/kernels/<kernel>)
    description: str = ""
    args: dict[str, Any] = field(default_factory=dict)  # engine flags without the leading dashes
    extra_args: list[str] = field(default_factory=list)  # more command-line words, appended as they are
    env: dict[str, str] = field(default_factory=dict)  # the server's environment variables
    python: str | None = None  # the Python that runs the engine (default: the adapter's)
    command: list[str] | None = None  # vllm: the words that start the server
    url: str | None = None  # external: the server's base URL
    api: str | None = None  # external: sglang | openai
    startup_timeout_s: float | None = None  # bring-up timeout (default: server.startup_timeout_s)
    # the environment variable that holds the server's API key (read at run time, never written); None: no key.
    # Left out of to_dict when None (spec_hash of a configuration without one stays)
    api_key_env: str | None = field(default=None, metadata={"omit_if_none": True})
    # external: the server's own log on this machine, read for what the server reports of itself (KV pool, KV
    # dtype, weights' type); left out of to_dict when None
    server_log: str | None = field(default=None, metadata={"omit_if_none": True})
    # external: where the server computes, cpu | gpu (of this machine) | remote; None: remote. Left out
    # of to_dict when None, so that the specs (and spec_hash) of configurations that do not set it stay as they were.
    device: str | None = field(default=None, metadata={"omit_if_none": True})
    # external: the scheduler the server runs, {engine, args} (longctx.engines.external.SCHEDULERS), for the what-if
    # simulation; None: not known, not simulated. Left out of to_dict() when None
    scheduler: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    # config key load, where this configuration measures the load workloads (longctx.measure.load); None
    # where it measures none, left out of to_dict then (the spec_hash of a configuration without load stays)
    load: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    # config key prefix, where this configuration measures the reused-context workloads (longctx.measure.prefix)
    prefix: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    # engine imported: the result files and what the config says of the runs they hold (format, files,
    # tool_version, bins, hardware, kv_pool_tokens, context_length); None for a configuration that is measured
    imported: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    # config key lengths.adaptive: the sweep chooses its lengths (from `lengths`, the grid) while it runs
    # (longctx.measure.adaptive); None for a fixed sweep, left out of to_dict then
    adaptive: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    # config key metronome, where this configuration's run takes its readings (longctx.measure.metronome); None where it
    # takes none (metronome.enabled false, or results imported), left out of to_dict then
    metronome: dict[str, Any] | None = field(default=None, metadata={"omit_if_none": True})
    # config key configurations.<name>.verifies: the configuration whose advice this run proves (config key advise);
    # its lengths and load are the goal's. None: an ordinary configuration. Left out of to_dict() when None
    verifies: str | None = field(default=None, metadata={"omit_if_none": True})

    def api_key(self) -> str | None:
        """The server's API key, from the environment variable api_key_env names (None where it names none);
        ConfigError when that variable is unset or empty."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env, "")
        if not key:
            from ..core.errors import ConfigError

            raise ConfigError(f"config key 'configurations.{self.name}.api_key_env': the environment variable "
                              f"{self.api_key_env} is not set (or empty); export the server's API key in it, or "
                              "remove the key for a server that takes none")
        return key

    def auth_headers(self) -> dict[str, str]:
        """What every request to the server carries: its API key as a Bearer token, where it has one, else the user
        and password its URL carries (http://user:pass@host) as HTTP Basic; the URL is then used without them
        (base_url), so that no URL written, shown or passed holds them."""
        key = self.api_key()
        if key:
            return {"Authorization": f"Bearer {key}"}
        _, user, password = url_parts(self.url)
        if user is None and password is None:
            return {}
        pair = f"{unquote(user or '')}:{unquote(password or '')}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def base_url(self) -> str | None:
        """The server's URL without the user and password it may carry (auth_headers sends them)."""
        return url_parts(self.url)[0]

    def url_secrets(self) -> list[str]:
        """What the URL carries that no text may show: its user and password (a token given as the user name alone,
        http://TOKEN@host, is one), and the Basic credential made of them."""
        _, user, password = url_parts(self.url)
        if user is None and password is None:
            return []
        found = [v for v in (user, password) if v]
        return [*found, *map(unquote, found), self.auth_headers().get("Authorization", "").removeprefix("Basic ")]

    def hashable(self) -> dict[str, Any]:
        """to_dict() with every secret value keyed (core.secrets.keyed): the environment's values, the URL's user,
        password and secret query values, secret-named values and the words of secret flags. A changed value still
        changes spec_hash and the resume key, and no digest published (raw files, version records, Snakemake's
        records) can be tested against a guessed value without this workflow directory's key."""
        d = keyed_secrets(self.to_dict())
        d["env"] = {k: keyed(v) for k, v in (d.get("env") or {}).items()}
        if d.get("url"):
            masked = mask_url(d["url"])
            d["url"] = masked if masked == d["url"] else f"{masked}#{keyed(d['url'])}"
        for words in ("extra_args", "command"):
            d[words] = mask_argv(d.get(words), keyed)
        return d

    def spec_hash(self) -> str:
        """The digest that names this spec in the raw files and on the bench's command line (hashable's)."""
        return digest(self.hashable())

    def to_dict(self) -> dict[str, Any]:
        """The spec as a plain dictionary (a deep copy): what spec_hash and resume_key digest."""
        d = asdict(self)
        for f in fields(self):
            if f.metadata.get("omit_if_none") and d[f.name] is None:
                del d[f.name]
        return d

    def settings(self) -> dict[str, Any]:
        """What must be the same for two measurements of this configuration to be compared (longctx.analysis.identity):
        {"shown": the settings as dotted keys (args.page-size, protocol.output_tokens, model.architecture.hidden_size,
        env: the environment's variable names, command...), "hash": a digest of them, "scheme": SETTINGS_SCHEME}.
        No secret is among them, so none is in the hash either: every secret-named value is hidden, a secret flag's
        word is hidden, and of the environment only the variables' names are kept (a value may be a token). Not in
        them: where an external server listens (its URL: the same server on another port is the same deployment), the
        name, the lengths, the kernel (what a comparison looks at), how many trials and warm-ups and the timeouts (more
        trials compare with fewer), the description, and what only schedules or watches the job (server, telemetry,
        load, prefix, metronome)."""
        d = self.to_dict()
        protocol = {k: v for k, v in d["protocol"].items() if k not in SETTINGS_PROTOCOL_LEFT_OUT}
        kept = {"engine": d["engine"], "api": d["api"], "device": d.get("device"), "model": d["model"], "args": d["args"],
                "extra_args": mask_argv(d["extra_args"]), "protocol": protocol, "env": sorted(d["env"] or {}),
                "command": mask_argv(d["command"])}
        shown = _dotted(mask(kept))
        return {"shown": shown, "hash": digest(shown), "scheme": SETTINGS_SCHEME}

    def to_json(self) -> str:
        """Canonical JSON of to_dict(): what the workflow passes to `longctx bench --spec`."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ConfigurationSpec":
        """The spec of a dictionary such as to_dict() returns; ConfigError names a missing or unknown key."""
        from ..core.errors import ConfigError

        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ConfigError(f"configuration spec: unknown keys {', '.join(unknown)}; allowed keys: {', '.join(names)}")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING and f.name not in d]
        if missing:
            raise ConfigError(f"configuration spec: missing keys {', '.join(missing)}")
        return cls(**copy.deepcopy(d))

    @classmethod
    def from_json(cls, text: str) -> "ConfigurationSpec":
        return cls.from_dict(json.loads(text))
