"""Configuration: load, validate against config/schema.yaml, fill defaults, and cut per-configuration specs.

Errors name the key and the allowed values, so that a typo is fixed in one read.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

from .core.errors import ConfigError
from .core.net import is_loopback
from .core.secrets import redact_config
from .engines import ConfigurationSpec, get_adapter
from .engines.imported import IMPORTED_KEYS

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = ROOT / "config" / "schema.yaml"
KERNEL_BUILD_DIR = "build/kernels"
# What a configuration asks of the machine, not how it is measured: kept out of its spec, so that
# changing it reruns nothing.
SCHEDULING_KEYS = ("resources",)


def _with_defaults(cls):
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_Validator = _with_defaults(Draft202012Validator)


def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _describe(error) -> str:
    if error.validator == "oneOf" and error.context:  # the branch of the instance's own type (lengths: a list, or adaptive)
        from jsonschema.exceptions import best_match

        branches = [i for i, sub in enumerate(error.schema["oneOf"])
                    if sub.get("type") == {list: "array", dict: "object"}.get(type(error.instance))]
        own = [e for e in error.context if e.relative_schema_path and e.relative_schema_path[0] in branches]
        return _describe(best_match(own or error.context))
    key = _key(error.absolute_path)
    schema = error.schema
    if error.validator == "additionalProperties" and schema.get("properties"):
        extra = sorted(set(error.instance) - set(schema["properties"]))
        where = _key(error.absolute_path)
        return "; ".join(
            f"config key '{where + '.' if error.absolute_path else ''}{k}' is unknown; allowed keys: "
            + ", ".join(sorted(schema["properties"]))
            for k in extra
        )
    if error.validator == "enum":
        return f"config key '{key}': {error.instance!r} is not allowed; allowed values: " + ", ".join(map(str, schema["enum"]))
    if error.validator == "required":
        return f"config key '{key}': {error.message}"
    if error.validator == "propertyNames":
        return f"config key '{key}': name {error.instance!r} must match {schema.get('pattern')}"
    return f"config key '{key}': {error.message}"


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Return a validated copy of config with every default filled in; raise ConfigError."""
    config = _inherit_verified(copy.deepcopy(dict(config)))
    errors = sorted(_Validator(_schema()).iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(_describe(e) for e in errors))
    lengths = config["lengths"]
    if isinstance(lengths, dict):
        a = lengths["adaptive"]
        if a["max"] <= a["min"]:
            raise ConfigError(f"config key 'lengths.adaptive.max': must exceed min ({a['min']}), got {a['max']}")
    elif sorted(set(lengths)) != lengths:
        raise ConfigError(f"config key 'lengths': must be strictly increasing, got {lengths}")
    low, high = config["protocol"]["token_id_range"]
    if high <= low:
        raise ConfigError(f"config key 'protocol.token_id_range': high must exceed low, got {[low, high]}")
    host = config["server"]["host"]
    if not is_loopback(host) and not config["server"]["allow_remote"]:
        raise ConfigError(f"config key 'server.host': {host!r} is not a loopback address, so the servers longctx starts "
                          "would be reachable from the network; allowed values: 127.0.0.1, ::1, localhost, or set "
                          "server.allow_remote: true to listen there on purpose")
    baseline = config["report"]["baseline"]
    if baseline is not None and baseline not in config["configurations"]:
        raise ConfigError(f"config key 'report.baseline': {baseline!r} is not a configuration; "
                          f"allowed values: {', '.join(config['configurations'])}")
    for name in config["whatif"]["configurations"] or []:
        if name not in config["configurations"]:
            raise ConfigError(f"config key 'whatif.configurations': {name!r} is not a configuration; "
                              f"allowed values: {', '.join(config['configurations'])}")
    for name, conf in config["configurations"].items():
        kernel = conf["kernel"]
        if kernel is not None and kernel not in config["kernels"]:
            raise ConfigError(
                f"config key 'configurations.{name}.kernel': {kernel!r} is not a key of 'kernels'; "
                f"allowed values: {', '.join(sorted(config['kernels'])) or '(none defined)'}"
            )
        adapter = get_adapter(conf["engine"])
        if "device" in conf and adapter.managed:
            raise ConfigError(f"config key 'configurations.{name}.device' is for external servers; a {conf['engine']} "
                              "server's device comes from its flags and installation (remove the key)")
        if conf.get("scheduler") and (adapter.managed or not adapter.measures):  # a server measured, not started
            raise ConfigError(f"config key 'configurations.{name}.scheduler' is for external servers; a {conf['engine']} "
                              "server's scheduler is its adapter's, from its flags (remove the key)")
        if conf.get("server_log") and adapter.managed:
            raise ConfigError(f"config key 'configurations.{name}.server_log' is for external servers; a {conf['engine']} "
                              "server's log is longctx's own (data/logs/server/<configuration>.log; remove the key)")
        if adapter.measures:
            given = [k for k in IMPORTED_KEYS if k in conf]
            if given:
                raise ConfigError(f"config key 'configurations.{name}.{given[0]}' is for imported results (engine: imported); "
                                  f"a {conf['engine']} server is measured (remove the key)")
        _check_verifies(name, conf, config, adapter)
        adapter.check_spec(name, conf, config)
        adapter.check_args(name, conf["args"])
        _check_context(name, conf, config, adapter)
    return config


def _inherit_verified(config: dict) -> dict:
    """A configuration that verifies another's advice (configurations.<name>.verifies) is a copy of that one with its
    own keys over it (the recommended flags in `args`, merged key by key): the file `longctx advise --verify` writes
    names only the flags, never the server's environment or key."""
    confs = config.get("configurations")
    if not isinstance(confs, dict):
        return config
    for name, conf in confs.items():
        target = conf.get("verifies") if isinstance(conf, dict) else None
        base = confs.get(target) if isinstance(target, str) and target != name else None
        if isinstance(base, dict) and not base.get("verifies"):
            confs[name] = merge(copy.deepcopy(base), conf)
    return config


def _check_verifies(name: str, conf: dict, config: dict, adapter) -> None:
    """configurations.<name>.verifies names another configuration, not one that verifies in turn, and the goal it
    proves is set (config key advise, with a context or a workload), on a server longctx measures."""
    target = conf.get("verifies")
    if target is None:
        return
    key = f"config key 'configurations.{name}.verifies'"
    others = [n for n, c in config["configurations"].items() if n != name and not c.get("verifies")]
    if target not in others:
        raise ConfigError(f"{key}: {target!r} is not a configuration it can verify; allowed values: "
                          f"{', '.join(others) or '(none)'}")
    goal = config.get("advise") or {}
    if not (goal.get("context") or goal.get("workload")):
        raise ConfigError(f"{key}: there is no goal to verify: set config key 'advise' with a context or a workload "
                          "(docs/advise.md)")
    if not adapter.measures:
        raise ConfigError(f"{key}: a {conf['engine']} configuration measures nothing; allowed engines: those longctx "
                          "measures (a managed server, or an external one restarted with the flags)")


def config_error_lines(error: ConfigError) -> str:
    """How the workflow says a config error on the terminal: `longctx: config error: <message>`, a line per
    problem (the schema's several, each naming its key), and no traceback."""
    lines = str(error).splitlines()
    if len(lines) > 1 and lines[0] == "invalid configuration:":
        lines = lines[1:]
    return "\n".join(f"longctx: config error: {line.strip()}" for line in lines if line.strip())


def adaptive_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The adaptive sweep's settings (config key lengths.adaptive), or None for a fixed sweep."""
    lengths = config["lengths"]
    return lengths["adaptive"] if isinstance(lengths, dict) else None


def grid(settings: dict[str, Any]) -> list[int]:
    """The lengths an adaptive sweep may choose (config key lengths.adaptive): min, min x ratio, ... below max, and max."""
    lo, hi, r = int(settings["min"]), int(settings["max"]), float(settings["ratio"])
    out, x = [], float(lo)
    while x < hi * (1 - 1e-9):
        out.append(int(round(x)))
        x *= r
    return sorted(set(out)) + [hi]


def length_grid(config: dict[str, Any]) -> list[int]:
    """The lengths a sweep may measure: the fixed sweep's, or the adaptive sweep's grid (min to max by ratio)."""
    a = adaptive_of(config)
    return grid(a) if a else list(config["lengths"])


def requests_of(config: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(what, prompt tokens, output tokens) of every request a sweep sends: each length, and the ITL-depth one."""
    proto = config["protocol"]
    out = [("lengths", n, proto["output_tokens"]) for n in length_grid(config)]
    load = config.get("load") or {}
    if load:
        out += [("load.lengths", n, load["output_tokens"]) for n in load["lengths"]]
        out += [("load.interference.lengths", n, 1) for n in load["interference"]["lengths"]]
        if load["interference"]["lengths"]:
            bg = load["interference"]
            out.append(("load.interference.background_length", bg["background_length"],
                        bg["steady_tokens"] + bg["tail_tokens"] + 1))
    prefix = config.get("prefix") or {}
    if prefix:
        out += [("prefix.lengths", n, prefix["output_tokens"]) for n in prefix["lengths"]]
        conv = prefix["conversation"]
        if conv["max_context"]:
            out.append(("prefix.conversation.max_context", conv["max_context"], conv["output_tokens"]))
    depth = proto["itl_depth"]
    if depth["length"]:
        out.append(("protocol.itl_depth.length", depth["length"], depth["output_tokens"]))
    metronome = config.get("metronome") or {}
    if metronome.get("enabled"):
        out.append(("metronome.length", metronome["length"], metronome["output_tokens"]))
    return out


def verify_lengths(config: dict[str, Any]) -> list[int]:
    """The lengths a configuration that verifies the advice measures (configurations.<name>.verifies): the goal's
    prompt, and the longest prompt the goal's context holds beside the protocol's output tokens (the request that
    must fit)."""
    goal = config["advise"]
    out = {int(goal["workload"]["prompt"])} if goal.get("workload") else set()
    if goal.get("context"):
        out.add(int(goal["context"]) - int(config["protocol"]["output_tokens"]))
    return sorted(out)


def workload_requests(workload: dict[str, Any]) -> int:
    """The requests of the advice's workload (config key advise.workload): as many as it says, else at least 32 and
    four times its concurrency (4 x 8 for arrivals at a rate): what the advice simulates and its verifying run sends."""
    return int(workload.get("requests") or max(32, 4 * int(workload.get("concurrency") or 8)))


def verify_load(config: dict[str, Any]) -> dict[str, Any] | None:
    """The load workload a configuration that verifies the advice measures: the goal's, as the config's load section
    measures a point (its closed loop at the goal's concurrency, or its open loop at the goal's rate, at the goal's
    prompt and output lengths; no interference probe); None where the goal has no workload."""
    w = config["advise"].get("workload")
    if not w:
        return None
    load = copy.deepcopy(config["load"])
    requests = workload_requests(w)
    load.update(lengths=[int(w["prompt"])], output_tokens=int(w["output"]))
    load["closed"].update(concurrency=[int(w["concurrency"])] if w.get("concurrency") else [], requests=requests,
                          duration_s=None)
    load["open"].update(rates=[float(w["rate"])] if w.get("rate") else [], requests=requests)
    load["interference"]["lengths"] = []
    if not w.get("rate"):  # the wake probe is asked for the open loops' arrivals only
        load["wake"]["idle_s"] = []
    return load


def load_of(config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The load workloads configuration `name` measures (config key load), or None: it measures none
    (configurations.<name>.load false, or neither load.lengths with a level nor interference lengths). A configuration
    that verifies the advice measures the goal's workload (verify_load)."""
    if config["configurations"][name].get("verifies"):
        return verify_load(config)
    load = config["load"]
    levels = load["closed"]["concurrency"] or load["open"]["rates"]
    if not config["configurations"][name].get("load", True):
        return None
    if not (load["lengths"] and levels) and not load["interference"]["lengths"]:
        return None
    return load


def prefix_of(config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The reused-context workloads configuration `name` measures (config key prefix), or None: it measures
    none (configurations.<name>.prefix false, or neither prefix.lengths with a hit rate nor a conversation)."""
    prefix = config["prefix"]
    if not config["configurations"][name].get("prefix", True) or config["configurations"][name].get("verifies"):
        return None
    if not (prefix["lengths"] and prefix["hit_rates"]) and not prefix["conversation"]["max_context"]:
        return None
    return prefix


def metronome_of(config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The metronome configuration `name`'s run takes (config key metronome), or None: it takes none (metronome.enabled
    false, or its results are imported: no run of longctx's measured them)."""
    metronome = config["metronome"]
    if not metronome["enabled"] or not get_adapter(config["configurations"][name]["engine"]).measures:
        return None
    return metronome


def _check_context(name: str, conf: dict, config: dict, adapter) -> None:
    """Every request must fit the configuration's context length where its flags set one: prompt plus
    output tokens at most the context length (SGLang and vLLM refuse more), before any server starts."""
    try:
        limit = adapter.context_length(conf["args"], {})
    except (TypeError, ValueError):  # a form the engine parses itself ("200k"): its server will say
        return
    if not limit:
        return
    for key, prompt, output in requests_of(config):
        if prompt + output > limit:
            raise ConfigError(
                f"config key '{key}': {prompt} prompt tokens and {output} output tokens do not fit configuration "
                f"{name!r}'s context length of {limit} (configurations.{name}.args.{adapter.context_length_flag}); "
                f"allowed: prompts of at most {limit - output} tokens there, or a longer context length")


def yaml_error_message(path: str | Path, exc: yaml.YAMLError) -> str:
    """What a YAML error says to a person: the file, the line and the column (1-based), then YAML's own words."""
    mark = getattr(exc, "problem_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"config file {path} is not valid YAML{where}: {exc}"


def read(path: str | Path) -> dict[str, Any]:
    """One config file as written (not validated); a YAML error names the file, the line and the column."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_message(path, exc)) from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: its top level must be a mapping of config keys, not {type(raw).__name__}")
    return raw or {}


def merge(base: dict, update: dict) -> dict:
    """base updated by update, mappings merged key by key (as Snakemake merges --configfile and --config)."""
    out = dict(base)
    for key, value in update.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load(path: str | Path | list, overrides: dict | None = None) -> dict[str, Any]:
    """The validated config of one file, or of several merged in order (then overrides), as the workflow sees them."""
    raw: dict = {}
    for p in (path if isinstance(path, (list, tuple)) else [path]):
        raw = merge(raw, read(p))
    return validate(merge(raw, overrides or {}))


# The environment variable through which the workflow tells `longctx bench` which config files (and
# --config values) it merged: {"configfiles": [...], "overrides": {...}} as JSON
CONFIG_SOURCES_VAR = "LONGCTX_CONFIG_SOURCES"


def redacted(config: dict[str, Any]) -> dict[str, Any]:
    """The config with every secret hidden (longctx.core.secrets.redact_config): what may reach a Snakemake param,
    a log or the report (the values stay in the config file)."""
    return redact_config(config)


# keys that say how a run is judged, not what it measured or how the report reads: left out of the report's config
RUN_ONLY_KEYS = ("allow_missing",)


def report_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config the report prints and hashes into its version: redacted, without RUN_ONLY_KEYS (so that
    `--config allow_missing=True` makes no new version)."""
    return {k: v for k, v in redacted(config).items() if k not in RUN_ONLY_KEYS}


def report_baseline(config: dict[str, Any]) -> str:
    """The configuration the report's speedups are against: report.baseline, or the first one listed."""
    return config["report"]["baseline"] or next(iter(config["configurations"]))


def kernel_build_dir(kernel: str) -> str:
    return f"{KERNEL_BUILD_DIR}/{kernel}"


def configuration_spec(config: dict[str, Any], name: str) -> ConfigurationSpec:
    """Everything the bench of one configuration needs, and nothing of the other configurations:
    its keys less the scheduling ones, the kernel's build directory, and the config's lengths,
    protocol, server, telemetry and model sections."""
    if name not in config["configurations"]:
        raise ConfigError(
            f"configuration {name!r} is not in the config; allowed values: {', '.join(config['configurations'])}"
        )
    conf = {k: v for k, v in config["configurations"][name].items() if k not in SCHEDULING_KEYS + IMPORTED_KEYS}
    imported = {k: v for k, v in config["configurations"][name].items() if k in IMPORTED_KEYS}
    conf["load"] = load_of(config, name)
    conf["prefix"] = prefix_of(config, name)
    conf["metronome"] = metronome_of(config, name)
    kernel = conf["kernel"]
    return ConfigurationSpec.from_dict({
        "name": name,
        **conf,
        "kernel_build": kernel_build_dir(kernel) if kernel else None,
        "imported": imported or None,
        "lengths": verify_lengths(config) if conf.get("verifies") else length_grid(config),
        "adaptive": None if conf.get("verifies") else adaptive_of(config),
        "protocol": config["protocol"],
        "server": config["server"],
        "telemetry": config["telemetry"],
        "model": merge(config["model"], imported["model"]) if imported.get("model") else config["model"],
    })


