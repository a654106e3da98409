"""`longctx ab`: the kernel sources of the working tree (B) against an earlier version's (A), measured in ONE run,
interleaved, and gated.

A comparison of two versions measured hours apart (longctx.report.changes) is only as good as the machine stood
still; this one is not exposed to that: both builds are measured on the same machine in the same run, alternating
in blocks (A B B A ...) per configuration and length, so that drift and a busy neighbour hit both sides, and the
interval's unit of replication is the pair of neighbouring blocks (longctx.analysis.paired).

- The baseline's sources: a kept version's (report/versions/sources/, longctx.report.versions.keep_sources) or a
  git revision's (`git show REV:path`).
- What is measured: every configuration that uses a kernel whose sources differ between the two; where none
  differs, every configuration that uses a kernel (an A/A run: the machine's noise, which passes).
- Levels: "server" (longctx.measure.ab: lone requests of the protocol behind each side's server; TTFT and decode) with
  the kernel micro-benchmark beside; "kernel" (longctx.attention.kernel_ab: both builds in one process, calls
  alternated), the cheap path for servers that take minutes to start. The verdict comes from the server level where
  it was run, else from the kernel level, and the page says which.
- What it cost: server starts and wall time, on the terminal and the page.
The verdict is the gate's (longctx.report.gate.verdict): exit 0, 1 (slower beyond the margin, or lost), 2.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

from .. import config as cfg
from ..analysis import ab as abstats
from ..analysis.compare import CORRECTION, DETECTION
from ..analysis.sides import INTERLEAVED
from ..attention import build as kbuild
from ..core.errors import ConfigError, write_atomic
from ..engines import get_adapter
from . import change_words, gate, versions

BUILD_ROOT = Path("build/ab")
SOURCES = {"server": "server-level A/B: both builds behind each configuration's server, lone requests interleaved in "
                     "blocks in one run",
           "kernel": "kernel micro-benchmark A/B: both builds in one process, calls alternated in blocks (the server-level "
                     "A/B was not run)"}


class ABError(SystemExit):
    """The A/B cannot be run: the message says why, in one line."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def baseline_sources(config: dict, kernel: str, against: str | None, against_rev: str | None,
                     versions_dir: str | Path, root: str | Path = ".") -> dict[str, bytes]:
    """The baseline's sources of `kernel`: {path: content}, from the kept version `against` (the sources its
    configurations using the kernel measured) or from git revision `against_rev` (the kernel's configured sources as
    they were there). ABError where they cannot be had."""
    if against_rev:
        out = {}
        for path in config["kernels"][kernel]["sources"]:
            proc = subprocess.run(["git", "-C", str(root), "show", f"{against_rev}:{path}"], capture_output=True, timeout=30)
            if proc.returncode != 0:
                raise ABError(f"the A/B's baseline: {path} cannot be read at git revision {against_rev!r} "
                              f"({proc.stderr.decode(errors='replace').strip()[:200]})")
            out[path] = proc.stdout
        return out
    from .changes import version_number

    record, why = versions.find(versions_dir, version_number(against))
    if record is None:
        raise ABError(f"the A/B's baseline: {why}")
    idents = (record.get("measurements") or {}).get("configurations") or {}
    kept = next(((ident.get("kernel") or {}).get("sources") for ident in idents.values()
                 if (ident.get("kernel") or {}).get("name") == kernel and (ident.get("kernel") or {}).get("sources")), None)
    if not kept:
        raise ABError(f"the A/B's baseline: {against} measured no configuration with kernel {kernel!r}; name another "
                      "version, or a git revision with --against-rev")
    out = {}
    for path, sha in kept.items():
        data = versions.kept_source(versions_dir, sha)
        if data is None:
            raise ABError(f"the A/B's baseline: {against} kept no copy of {path} (versions keep their kernel sources "
                          "since longctx 0.2; older ones did not): name the git revision it was measured at with "
                          f"--against-rev (its commit: {(record.get('entry') or {}).get('commit') or 'not recorded'})")
        out[path] = data
    return out


def plan(config: dict, against: str | None, against_rev: str | None, versions_dir: str | Path,
         root: str | Path = ".") -> dict:
    """What the A/B compares: per kernel that a configuration uses, its sources now and the baseline's and which files
    differ; the configurations measured (those whose kernel differs; every kernel's, for an A/A run)."""
    if bool(against) == bool(against_rev):
        raise ABError("the A/B needs one baseline: --against vN (a kept version) or --against-rev REV (a git revision); "
                      "or ab.against / ab.against_rev in the config")
    used = sorted({c["kernel"] for c in config["configurations"].values() if c.get("kernel")})
    if not used:
        raise ABError("no configuration uses a kernel (configurations.<name>.kernel): the A/B compares kernel builds")
    kernels = []
    for k in used:
        now = {p: (Path(root) / p).read_bytes() for p in config["kernels"][k]["sources"]}
        before = baseline_sources(config, k, against, against_rev, versions_dir, root)
        a, b = _by_name(before), _by_name(now)
        differs = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
        kernels.append({"name": k, "kind": config["kernels"][k]["kind"], "now": now, "before": before, "differs": differs})
    aa = not any(k["differs"] for k in kernels)
    chosen = [k["name"] for k in kernels if k["differs"] or aa]
    names = [n for n, c in sorted(config["configurations"].items()) if c.get("kernel") in chosen
             and get_adapter(c["engine"]).managed]
    wanted = (config.get("ab") or {}).get("configurations")
    if wanted:
        names = [n for n in names if n in wanted]
    return {"baseline": against or f"git {against_rev}", "aa": aa, "kernels": [k for k in kernels if k["name"] in chosen],
            "configurations": names}


def _by_name(sources: dict[str, bytes]) -> dict[str, str]:
    """{file name: content hash}: a kernel's sources compared by name (a build keeps names, a version paths)."""
    return {Path(p).name: _sha(d) for p, d in sources.items()}


def build_sides(kernel: dict, cuda_archs: tuple[str, ...], root: Path = BUILD_ROOT) -> dict[str, Path]:
    """Both builds of a kernel: A from the baseline's sources (written under build/ab/A-src/), B from the working
    tree's; {"A": build dir, "B": build dir}. Each is checked against the reference as every build is."""
    out = {}
    for side, sources in (("A", kernel["before"]), ("B", kernel["now"])):
        src = root / f"{side}-src"
        paths = []
        for path, data in sources.items():
            p = src / path
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            paths.append(str(p))
        out[side] = root / side / kernel["name"]
        kbuild.build(kernel["name"], kernel["kind"], paths, out[side], cuda_archs)
    return out


def measure(config: dict, the_plan: dict, data_dir: str | Path, log_dir: str | Path) -> dict:
    """Build both sides and measure them: the kernel level always (cheap), the server level where ab.level is
    "server". Returns the measurements (what verdict() reads; also what `longctx ab` writes to data_dir)."""
    import torch

    from ..attention import kernel_ab
    from ..attention.shapes import served_shape
    from ..measure.ab import ab_spec, run_ab

    settings = config["ab"]
    started = time.monotonic()
    lengths = settings["lengths"] or cfg.length_grid(config)
    builds = {k["name"]: build_sides(k, tuple(config["kernels"][k["name"]]["cuda_archs"])) for k in the_plan["kernels"]}
    kernel_level = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a kernel's threads wait for whichever one a neighbour preempted: one is steadier
    try:
        for k in the_plan["kernels"]:
            using = {n: c for n, c in config["configurations"].items() if c.get("kernel") == k["name"]}
            shape = served_shape(k["name"], {n: get_adapter(c["engine"]).model_spec(config["model"], c["args"])
                                             for n, c in using.items()})
            gpu = any(get_adapter(c["engine"]).compute_device(c["args"]) == "gpu" for c in using.values())
            device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
            a, b = kernel_ab.load_pair(builds[k["name"]]["A"], builds[k["name"]]["B"], device)
            kernel_level.append({"kernel": k["name"], **kernel_ab.alternate(a, b, shape, lengths, settings["blocks"],
                                                                            settings["calls_per_block"], device)})
    finally:
        torch.set_num_threads(threads)
    server_level = []
    if settings["level"] == "server":
        for name in the_plan["configurations"]:
            spec = cfg.configuration_spec(config, name)
            sides = {s: ab_spec(spec, builds[spec.kernel][s], lengths) for s in ("A", "B")}
            server_level.append(run_ab(sides, Path(data_dir) / name,
                                       {s: Path(log_dir) / f"{name}-{s}.log" for s in ("A", "B")},
                                       settings["blocks"], settings["trials_per_block"], settings["servers"]))
    return {"format": "longctx.ab/1", "baseline": the_plan["baseline"], "aa": the_plan["aa"],
            "kernels": [{"name": k["name"], "differs": k["differs"]} for k in the_plan["kernels"]],
            "configurations": the_plan["configurations"], "settings": settings, "lengths": lengths,
            "margin": config["report"]["regression_margin"], "confidence": config["analysis"].get("confidence", 0.95),
            "server": server_level, "kernel": kernel_level,
            "cost": {"wall_s": time.monotonic() - started, "server_starts": abstats.starts(server_level)}}


def comparison(m: dict) -> dict:
    """The measurements as a comparison the gate reads (longctx.report.gate.verdict), from the server level where it
    was run, else the kernel level; the other level's family beside it ("kernel_level")."""
    level = "server" if m["server"] else "kernel"
    cells = abstats.server_cells(m["server"]) if level == "server" else abstats.kernel_cells(m["kernel"])
    fam = abstats.family(cells, level, m["confidence"], m["margin"])
    out = {"kind": INTERLEAVED, "source": SOURCES[level], "before": {"name": f"{m['baseline']}'s kernel sources"},
           "now": {"name": "the working tree's"}, "margin": m["margin"], "confidence": m["confidence"],
           "correction": CORRECTION, "detection": DETECTION, **fam, "unlike": [], "same": [], "aa": m["aa"],
           "kernels": [{"configuration": c, "kernel": k["name"], "before": k["name"], "files": k["differs"]}
                       for k in m["kernels"] if k["differs"] for c in m["configurations"]] if level == "server" else
           [{"configuration": k["name"], "kernel": k["name"], "before": k["name"], "files": k["differs"]}
            for k in m["kernels"] if k["differs"]],
           "cost": m["cost"]}
    out["detectable"] = change_words.detectable_words(out)
    out["sentence"] = change_words.kernel_sentence(out)
    if level == "server" and m["kernel"]:
        out["kernel_level"] = abstats.family(abstats.kernel_cells(m["kernel"]), "kernel", m["confidence"], m["margin"])
    return out


def cost_line(m: dict) -> str:
    c = m["cost"]
    what = "an A/A run (no kernel source differs: the machine's noise)" if m["aa"] else \
        "kernel " + ", ".join(f"{k['name']} ({', '.join(k['differs'])})" for k in m["kernels"] if k["differs"])
    return (f"A/B against {m['baseline']}: {what}; {len(m['server'])} configuration(s) at the server level, "
            f"{m['settings']['blocks']} blocks a side per length; cost {c['server_starts']} server starts and "
            f"{c['wall_s']:.0f} s")


def verdict(m: dict) -> tuple[int, dict, list[str]]:
    """The gate's verdict over the measurements, with the cost line first."""
    cmp = comparison(m)
    code, answer, lines = gate.verdict(cmp)
    answer["aa"] = m["aa"]
    return code, answer, [cost_line(m)] + lines


def _row_words(r: dict, f: str) -> str:
    c = r.get(f)
    if not c:
        return "--"
    if not c["ci"]:
        return f"{c['ratio']:.3g} (no interval)"
    return f"{c['ratio']:.3g} [{c['ci'][0]:.3g}, {c['ci'][1]:.3g}]" + (" **slower**" if c["regression"] else "")


def page(m: dict, lines: list[str]) -> str:
    """The A/B's page (report/ab.md): what was compared, which level the verdict comes from, what it cost, the
    gate's lines and the tables of both levels."""
    cmp = comparison(m)
    out = [f"# Kernel A/B against {m['baseline']}", "", cost_line(m) + ".", "",
           f"The verdict comes from the {SOURCES['server' if m['server'] else 'kernel']}. Ratios B/A (the working tree "
           "over the baseline) of the geometric means, with one-sided bounds at each row's level "
           f"({cmp['level']:.3%}, Bonferroni over {cmp['tests']}: no false 'slower' anywhere in the table in "
           f"{cmp['confidence']:.0%} of runs); the unit of replication is a pair of neighbouring blocks; a row is slower "
           f"beyond the margin where its bound clears {cmp['margin']:.0%}.", "", "## Gate", ""]
    out += [f"    {line}" for line in lines if line != cost_line(m)] + [""]
    for title, fam in (("Server level", cmp if m["server"] else None), ("Kernel level", cmp.get("kernel_level") or
                                                                          (None if m["server"] else cmp))):
        if not fam:
            continue
        figs = fam["rows"][0]["figures"] if fam["rows"] else []
        out += [f"## {title}", "", "| configuration | L | pairs | " + " | ".join(change_words.FIGURES[f].words + " B/A"
                                                                                  for f in figs) + " | unseen below |",
                "|---|---:|---:|" + "---|" * len(figs) + "---:|"]
        for r in fam["rows"]:
            seen = max((r[f]["detectable"] for f in figs if r.get(f) and r[f]["detectable"] is not None), default=None)
            out.append(f"| {r['configuration']} | {r['length']:,} | {r['n_now']} | " +
                       " | ".join(_row_words(r, f) for f in figs) + f" | {f'{seen:.0%}' if seen is not None else '--'} |")
        out.append("")
    return "\n".join(out) + "\n"


def write_outputs(m: dict, out_json: str | Path | None, out_md: str | Path | None) -> tuple[int, dict, list[str]]:
    """verdict(), written: the JSON answer (with the cost) and the page."""
    code, answer, lines = verdict(m)
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out_json, json.dumps(answer, indent=1, sort_keys=True) + "\n")
    if out_md:
        Path(out_md).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out_md, page(m, lines))
    return code, answer, lines


def check(config: dict) -> None:
    """ConfigError where ab names a configuration that is not in the config."""
    unknown = sorted(set((config.get("ab") or {}).get("configurations") or ()) - set(config["configurations"]))
    if unknown:
        raise ConfigError(f"config key 'ab.configurations': {', '.join(unknown)} not in configurations; allowed values: "
                          f"{', '.join(config['configurations'])}")
