"""The reference engine's process: the Engine (engine.py) behind its HTTP routes (routes.py), served by uvicorn."""

from __future__ import annotations

import json
import logging
import threading
import time

import uvicorn

from .args import build_parser
from ..specs.pool import PoolError
from .engine import Engine
from .routes import make_app
from .wire import WireH11Protocol

log = logging.getLogger("longctx.refengine")


GRACEFUL_SHUTDOWN_S = 2.0  # after SIGTERM, open responses get this long before the server exits
# glibc's malloc parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # the most glibc takes on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB


def hold_freed_memory() -> dict:
    """Keep what a request freed for the next one, as a server's own allocator does (PyTorch's caching allocator on
    a GPU): glibc's malloc hands a large block back to the kernel when it is freed (mmap'd above a threshold that
    grows only with the largest block freed so far, and the heap's top trimmed), so the next request touches its
    pages fresh, and a server's speed depended on the longest prompt it had seen: a 1,024-token TTFT of 32-37 ms
    young, 28-29 ms once it had held a 16k prompt; 95 ms at 2,048 with trimming alone pinned (python
    bench/server_age.py). With both thresholds fixed (blocks up to 32 MiB from the heap, the heap never trimmed below
    2 GiB of free top) the first requests measure what the thousandth does: 28-31 ms. Returns what was set, for
    /server_info; {} where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return {}
    done = {name: value for name, param, value in (("mmap_threshold", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                                   ("trim_threshold", M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            if mallopt(ctypes.c_int(param), ctypes.c_int(value))}
    return done


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(message)s")
    if args.device not in ("cpu",) and not args.device.startswith("cuda"):
        raise SystemExit(f"--device {args.device!r}; allowed: cpu, cuda[:N]")
    held = hold_freed_memory()  # before the engine allocates: its first requests measure what later ones do
    try:
        engine = Engine(args)
        engine.malloc = held
    except (PoolError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from exc
    shown = {**vars(args), "api_key": "(hidden)" if args.api_key else None}  # the key is not logged
    log.info("server_args=%s", json.dumps(shown, sort_keys=True))
    engine.scheduler.start()
    # On SIGTERM uvicorn waits for open responses; a stream whose client stopped reading never ends,
    # so the wait is bounded (SGLang, too, exits promptly on SIGTERM)
    config = uvicorn.Config(make_app(engine), host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                            http=WireH11Protocol, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = uvicorn.Server(config)

    def announce_ready() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.01)
        log.info("The server is fired up and ready to roll!")

    threading.Thread(target=announce_ready, daemon=True).start()
    server.run()
