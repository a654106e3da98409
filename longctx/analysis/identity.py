"""What a configuration's measurements are: the one rule of "like with like".

Two measurements of a configuration are compared (a version against an earlier one, longctx.report.changes; a
drafting configuration against its twin, longctx.analysis.drafting; the A/B's two sides, longctx.analysis.ab) only
where what made them is the same but for what the comparison looks at. A configuration's identity, from its
provenance entry (longctx.measure.sweep's): the engine, its version and its build (the code that ran: the
reference engine's source hash, an installed engine's version, how it was installed and the torch beside it:
EngineAdapter.installed_build), the hardware (machine), the model, the settings (ConfigurationSpec.settings: every
flag, the model, the protocol's choices, the environment's variable names and the URL and command, secrets never
among them: an environment variable's value is not, its name is) and the kernel (its name, build hash and source hashes).

`unlike(before, now, allow, ignored)` says why two identities are not like with like, or None where they are:
`allow` names the aspects the comparison itself varies ("kernel" for a kernel's versions), `ignored` the settings
it varies (a drafting configuration's drafting flags).
"""

from __future__ import annotations

import json
from typing import Callable

from ..core.secrets import mask

ASPECTS = ("engine", "engine_version", "engine_build", "hardware", "model", "settings", "kernel")


def engine_version(entry: dict) -> str | None:
    """The engine's version: as recorded at measurement, else as the server reported it (its /version or
    server_info's version)."""
    info = entry.get("server_info") or {}
    v = entry.get("engine_version") or (info.get("version") if isinstance(info, dict) else None)
    return str(v) if v else None


def machine(hw: dict | None) -> dict | None:
    """What makes two machines the same for a comparison: the CPU, the CPUs usable, the GPUs' names."""
    if not hw:
        return None
    return {"cpu": hw.get("cpu"), "usable_cpus": hw.get("usable_cpus"),
            "gpus": sorted(str(g.get("name")) for g in hw.get("gpus") or [])}


def identity(entry: dict) -> dict:
    """A configuration's identity from its provenance entry: engine, version and build, hardware, model, settings
    (shown, and their hash: neither holds a secret's value), kernel (name, build hash, source hashes), spec hash."""
    settings = entry.get("settings") or {}
    kernel = entry.get("kernel")
    return {"engine": entry.get("engine"), "engine_version": engine_version(entry),
            "engine_build": entry.get("engine_build"), "hardware": machine(entry.get("hardware")),
            "model": mask(entry.get("model")), "settings": settings.get("shown"), "settings_scheme": settings.get("scheme"),
            "kernel": {k: kernel.get(k) for k in ("name", "build_hash", "sources")} if kernel else None,
            "spec_hash": entry.get("spec_hash")}


def _differ(a, b) -> str:
    return f"{json.dumps(a)} then {json.dumps(b)}"


def kernel_changed(before: dict, now: dict) -> bool:
    """Whether a configuration's kernel (its name or any source's content) differs between two identities."""
    a, b = before.get("kernel") or {}, now.get("kernel") or {}
    return (a.get("name"), a.get("sources")) != (b.get("name"), b.get("sources"))


def changed_files(a: dict | None, b: dict | None) -> list[str]:
    """The kernel sources whose content differs between two kernel identities ({name, build_hash, sources})."""
    sa, sb = (a or {}).get("sources") or {}, (b or {}).get("sources") or {}
    return sorted(f for f in set(sa) | set(sb) if sa.get(f) != sb.get(f))


def _build_words(a: dict, b: dict) -> str:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(f"{k}: {a.get(k) or 'not reported'} then {b.get(k) or 'not reported'}" for k in keys)


def unlike(before: dict, now: dict, allow: tuple[str, ...] = ("kernel",),
           ignored: Callable[[str], bool] = lambda key: False) -> str | None:
    """Why two identities (identity()) are not like with like, or None where they are. allow: the aspects the
    comparison varies (ASPECTS); ignored(key): the dotted settings keys it varies. An engine build recorded on one
    side only (a version measured before builds were recorded) is not a difference; a kernel is one unless allowed."""
    if before.get("engine") != now.get("engine"):
        return f"the engine differs ({before.get('engine')} then {now.get('engine')})"
    if "engine_version" not in allow and before.get("engine_version") != now.get("engine_version"):
        return f"the engine's version differs ({before.get('engine_version') or 'not reported'} then " \
               f"{now.get('engine_version') or 'not reported'})"
    ba, bb = before.get("engine_build"), now.get("engine_build")
    if "engine_build" not in allow and ba and bb and ba != bb:
        return f"the engine's code differs ({_build_words(ba, bb)})"
    if "hardware" not in allow and before.get("hardware") != now.get("hardware"):
        a, b = before.get("hardware") or {}, now.get("hardware") or {}
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        return "the hardware differs (" + "; ".join(f"{k}: {_differ(a.get(k), b.get(k))}" for k in keys) + ")"
    why = _settings_unlike(before, now, ignored)
    if why:
        return why
    if "kernel" not in allow and kernel_changed(before, now):
        a, b = before.get("kernel") or {}, now.get("kernel") or {}
        files = changed_files(a, b)
        return f"the kernel differs ({a.get('name')} then {b.get('name')}" + (f"; {', '.join(files)}" if files else "") + ")"
    return None


def _settings_unlike(before: dict, now: dict, ignored: Callable[[str], bool]) -> str | None:
    sa, sb = before.get("settings"), now.get("settings")
    if sa is None or sb is None:  # measured before the settings were recorded: the whole spec must be the same
        if before.get("spec_hash") and before.get("spec_hash") == now.get("spec_hash"):
            return None
        return "its settings were not recorded in " + ("either version" if sa is None and sb is None else
                                                       "the earlier version" if sa is None else "this version") + \
            " and its specs differ"
    common = set(sa) | set(sb)
    if before.get("settings_scheme") != now.get("settings_scheme"):  # recorded by another longctx: what both recorded
        common = set(sa) & set(sb)
    keys = [k for k in sorted(common) if sa.get(k) != sb.get(k) and not ignored(k)]
    model = [k for k in keys if k.startswith("model.")]
    if model:
        return "the model differs (" + "; ".join(f"{k}: {_differ(sa.get(k), sb.get(k))}" for k in model[:3]) + ")"
    if keys:
        more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
        return "its settings differ (" + "; ".join(f"{k}: {_differ(sa.get(k), sb.get(k))}" for k in keys[:3]) + more + ")"
    return None
