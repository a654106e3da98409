"""Does a server prefill faster once it has served a long prompt? (issue 45, item 3: the sweep and the load stage
measure the same request 12-25% apart.)

Starts one configuration's server as the sweep does (longctx.measure.session.Session), then, each request after a
cache flush as the sweep's trials: `--repeats` requests at each of `--lengths` on the young server, one request at
`--long` tokens, and the same requests again. Prints each request's TTFT and the server's minor page faults over it
(/proc/<pid>/stat, field 10: the kernel's count of pages the process touched fresh).

    .venv/bin/python bench/server_age.py                        # config/longctx.yaml's page1-scattered, not primed
    .venv/bin/python bench/server_age.py --env GLIBC_TUNABLES=glibc.malloc.trim_threshold=4294967296

Measured on the 2-core CI-like VM (reference engine, page1-scattered), before the engine fixed glibc's malloc
thresholds (longctx.refengine.server.hold_freed_memory): at 1,024 tokens, 32-40 ms with 3,000-6,800 faults a
request while young, 28 ms with none after a 16k request; at 2,048, 69-74 ms young and 62-65 ms after. Since: the
first request at a length touches its pages once (36 ms, 4,449 faults), every later one 27-29 ms young and old,
and 64-68 ms at 2,048 (the sweep's warm-up takes that first request). Pinning the trim threshold alone (the --env
line above) disables glibc's growing mmap threshold: 43 ms and 95 ms at every request, 12,000 and 29,000 faults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx import config as lcfg  # noqa: E402
from longctx.engines import get_adapter  # noqa: E402
from longctx.measure.session import Session  # noqa: E402


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "config" / "longctx.yaml"))
    p.add_argument("--configuration", default="page1-scattered")
    p.add_argument("--lengths", default="1024,4096")
    p.add_argument("--long", type=int, default=16384, help="the long request between the two rounds")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server's environment")
    p.add_argument("--log", default="/tmp/longctx-server-age.log", help="the server's log")
    p.add_argument("--prime", action="store_true", help="prime the server as a run does (protocol.prime); off here, "
                   "so that the first round meets the server young")
    a = p.parse_args(argv)
    cfg = lcfg.load(a.config)
    cfg["protocol"]["prime"] = a.prime
    conf = cfg["configurations"][a.configuration]
    conf["env"] = {**conf.get("env", {}), **dict(kv.split("=", 1) for kv in a.env)}
    spec = lcfg.configuration_spec(cfg, a.configuration)
    s = Session(get_adapter(spec.engine), spec, Path(a.log), {})
    s.up()

    def one(length: int, key: str) -> tuple[float, int]:
        body = s.prompter.body(length, key, a.output_tokens)
        s.flush(600)
        before = minor_faults(s.server.pid)
        r = s.prompter.generate(s.client, s.base + s.api.generate_path, body, 600, length)
        return r["ttft_s"] * 1e3, minor_faults(s.server.pid) - before

    try:
        for phase in ("young", f"after {a.long:,}"):
            if phase != "young":
                ttft, faults = one(a.long, "long")
                print(f"{a.long:>7,}  TTFT {ttft:8.1f} ms  minor faults {faults}")
            for length in (int(x) for x in a.lengths.split(",")):
                rows = [one(length, f"{phase}/{length}/{i}") for i in range(a.repeats)]
                print(f"{phase:>12}  {length:>6,}  TTFT ms {' '.join(f'{t:6.1f}' for t, _ in rows)}  "
                      f"minor faults {' '.join(str(f) for _, f in rows)}", flush=True)
    finally:
        s.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
