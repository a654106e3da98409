"""The drafter question in words (fits.json's "drafting", longctx.analysis.drafting): page one's sentence per
drafting configuration, the speculative section's rows, and what the figures cannot say."""

from __future__ import annotations

from ..analysis.compare import FASTER, MARGIN, SLOWER
from ..analysis.drafting import pays
from ..core.numbers import is_number
from ..core.words import listed
from ..measure.prompts import text_words


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _ci(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""


def _tokens(L: int) -> str:
    return f"{L:,} tokens"


def _lengths(rows: list[dict]) -> str:
    return listed([f"{r['length']:,}" for r in rows])


def _effect(r: dict, where: bool = True) -> str:
    """'1.56x [1.39, 1.76] faster at 2,048 tokens' ('1.56x [1.39, 1.76]' without where)."""
    word = {FASTER: "faster", SLOWER: "slower"}.get(r["verdict"], "")
    said = f"{_x(r['speedup'])} {_ci(r['ci'])}"
    return f"{said} {word} at {_tokens(r['length'])}".replace("  ", " ") if where else said


def _acceptance(rows: list[dict]) -> str | None:
    acc = [r for r in rows if is_number(r.get("acceptance"))]
    if not acc:
        return None
    a, b = acc[0], acc[-1]
    if len(acc) == 1 or f"{a['acceptance']:.2g}" == f"{b['acceptance']:.2g}":
        return f"acceptance is {b['acceptance']:.2g} tokens per step" + ("" if len(acc) == 1 else " at every length")
    verb = "falls" if b["acceptance"] < a["acceptance"] else "rises"
    return f"acceptance {verb} from {a['acceptance']:.2g} to {b['acceptance']:.2g} tokens per step"


def sentence(name: str, c: dict, family: dict) -> str:
    """Page one's answer for one drafting configuration: where drafting made decode faster, where it stopped paying
    (or that it still pays at the longest length, or never did), and how acceptance moves with L."""
    rows = [r for r in c["rows"] if r.get("verdict") and r["verdict"] != "no interval"]
    acc = _acceptance(c["rows"])
    head = f"With {c['method'] + ' ' if c.get('method') else ''}drafting in {name}"
    if not c.get("baseline"):
        return f"{head}, {acc or 'no acceptance was measured'} (no twin without drafting to compare decode with)."
    head += f" (against {c['baseline']})"
    if not rows:
        return f"{head}, no length has trials enough for an interval" + (f"; {acc}." if acc else ".")
    margin = family.get("margin", MARGIN)
    faster, no, unclear = ([r for r in rows if pays(r, margin) == kind] for kind in ("yes", "no", "unclear"))
    slower = [r for r in rows if r["verdict"] == SLOWER]
    stop = c.get("stops_paying")
    under = f"no gain above {margin:.0%}"
    if stop:
        first = faster[0]
        said = f"decode is {_effect(first)}"
        if stop["after"] != first["length"]:
            said += f" (faster up to {_tokens(stop['after'])})"
        at = next(r for r in rows if r["length"] == stop["length"])
        said += f" and stops paying from {stop['length']:,} on ({under}: {_effect(at, where=False)})"
        if stop.get("slower_from"):
            said += f"; slower at {_lengths([r for r in slower if r['length'] >= stop['slower_from']])} tokens"
    elif faster and len(faster) == len(rows):
        a, b = faster[0], faster[-1]
        said = f"decode is faster at every length, {_effect(a)}" + (f" to {_effect(b)}" if b is not a else "")
    else:
        parts = []
        if faster:
            parts.append(f"decode is faster at {_lengths(faster)} tokens ({_effect(faster[-1], where=len(faster) > 1)})")
        if no:
            worse = f", slower at {_lengths(slower)}" if slower else ""
            parts.append(f"{'decode has ' if not faster else ''}{under} at {_lengths(no)} tokens{worse} "
                         f"({_effect(no[-1], where=len(no) > 1)})")
        if unclear:
            parts.append(f"at {_lengths(unclear)} tokens the interval is too wide to tell "
                         f"({_effect(unclear[-1], where=len(unclear) > 1)})")
        said = "; ".join(parts)
    n = sorted({(r["n"], r["n_baseline"]) for r in rows})
    trials = f"n={n[0][0]}/{n[0][1]} per length" if len(n) == 1 else "n per length in the table"
    level = f"{family['level'] * 100:.3g}%"
    return f"{head}, {said}" + (f"; {acc}" if acc else "") + f" ({trials}, {level} intervals of one family)."


def caveat(c: dict) -> str:
    """What the figures cannot say: acceptance is the text's and the model's, not the deployment's traffic."""
    model = c.get("model") or "the model served"
    return (f"Acceptance here is that of {model} on {text_words(c.get('text'))}: a drafter's acceptance, and so what it "
            "buys, depends on the text and the model, and is not the deployment's on its own traffic.")


def view(drafting: dict | None) -> dict:
    """{"configurations": [{name, baseline, why, rows, sentence, caveat, stops_paying}], "family", "sentence"}: the
    speculative section's and page one's words; "sentence" None where no configuration drafts."""
    drafting = drafting or {}
    family = drafting.get("family") or {}
    confs = []
    for name, c in sorted((drafting.get("configurations") or {}).items()):
        confs.append({"name": name, **c, "sentence": sentence(name, c, family), "caveat": caveat(c),
                      "rows": [{**r, "effect": _x(r["speedup"]) if is_number(r.get("speedup")) else None,
                                "interval": _ci(r.get("ci")) or None} for r in c["rows"]]})
    return {"configurations": confs, "family": family,
            "sentence": " ".join(c["sentence"] for c in confs) if confs else None}
