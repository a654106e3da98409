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


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(message)s")
    if args.device not in ("cpu",) and not args.device.startswith("cuda"):
        raise SystemExit(f"--device {args.device!r}; allowed: cpu, cuda[:N]")
    try:
        engine = Engine(args)
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
