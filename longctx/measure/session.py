"""The configuration's server for one run: started when first needed, probed, health-checked, restarted, stopped.

A managed server (one longctx launches) is started in its own process group on a free port
(measure.process), waited for until healthy, asked what it is (its info endpoints, its KV pool as the
adapter reads it, the telemetry source), and its prompts probed once (measure.prompts). After a fault
(it died, or stopped answering its health path) it is stopped and the next measurement starts it
again, at most server.max_restarts times. An external server is only connected to and checked.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import httpx

from ..core.errors import ConfigError
from ..core.net import is_loopback, listen_words
from ..core.secrets import mask, mask_argv, mask_url, scrub
from ..engines import ConfigurationSpec, EngineAdapter
from ..specs.pool import observed_pool
from .health import ExternalServer, NoHealthPath, ServerError
from .process import ManagedServer, PortTaken, free_port, pid_file, reap_stray, will_not_pass
from .provenance import model_provenance
from .rawfiles import may_pass
from .prime import prime
from .probe import NO_TOKENIZER
from .probe import probe as prompt_probe
from .prompts import Prompter, PromptError, tokenizer_path
from .telemetry import telemetry_source
from .text import HEAD_TOKENS, STDLIB, DocumentText, TextSourceError, source_path
from .transport import timed_client

log = logging.getLogger("longctx.measure.session")
# One line per bring-up attempt and per length: what `longctx bench --log` also shows on the console
progress = logging.getLogger("longctx.progress")

_UNAUTHORIZED = re.compile(r"\b40[13]\b")
PORT_ATTEMPTS = 5  # launches on fresh ports when another process took the chosen one
HEALTH_TIMEOUT_S = 10.0  # what a server answering its health path after a failed length must answer within
EXIT_GRACE_S = 1.0  # how long a server that stopped answering is given to be seen dead (died, not hung)
# Thread limits a workflow job inherits (Snakemake sets them to the job's threads). The server's
# threading belongs to its configuration (engine flags or `env`), so they are not passed on.
THREAD_LIMIT_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def fetch_server_info(client: httpx.Client, base: str, api) -> dict:
    """Everything the server says about itself at the API's info endpoints, merged."""
    info: dict = {}
    for path in api.info_paths:
        try:
            r = client.get(base + path, timeout=10)
            if r.status_code == 200:
                body = r.json()
                for key, value in (body.items() if isinstance(body, dict) else [("value", body)]):
                    info.setdefault(key, value)
                info.setdefault("endpoints", []).append(path)
        except (httpx.HTTPError, ValueError):
            continue
    return info


def server_env(spec: ConfigurationSpec) -> dict[str, str]:
    """The configuration's environment variables, plus LONGCTX_KERNEL_DIR (the absolute path of the
    kernel build it uses) for any engine: a server patched to run the kernel under study finds it there."""
    env = dict(spec.env or {})
    if spec.kernel_build:
        env.setdefault("LONGCTX_KERNEL_DIR", str(Path(spec.kernel_build).resolve()))
    return env


def prompt_lengths(spec: ConfigurationSpec) -> list[int]:
    """The prompt lengths this configuration's run asks for, longest first: its lengths, the ITL-depth request, the
    load and reused-context workloads."""
    load, prefix = spec.load or {}, spec.prefix or {}
    lengths = [*spec.lengths, spec.protocol.get("itl_depth", {}).get("length") or 0, *load.get("lengths", ()),
               *(load.get("interference") or {}).get("lengths", ()), *prefix.get("lengths", ()),
               (prefix.get("conversation") or {}).get("max_context") or 0]
    return sorted({int(x) for x in lengths}, reverse=True)


def longest_prompt(spec: ConfigurationSpec) -> int:
    """The most prompt tokens one request of this configuration's run asks for (prompt_lengths)."""
    return prompt_lengths(spec)[0]


class FatalServerError(ServerError):
    """A server that no restart within this run can bring up: its engine rejects the command line, its prompts
    cannot be built, or an external server is not ready. may_pass: whether a later run may find it otherwise (an
    external server not up yet, a server error), so that the same command, run again, tries again
    (measure.rawfiles.lost); a command line, a key or a tokenizer that is wrong stays wrong."""

    def __init__(self, message: str, may_pass: bool = False):
        super().__init__(message)
        self.may_pass = may_pass


class Session:
    """The configuration's server: started when first needed, restarted on a fresh port after it
    died or hung (at most server.max_restarts times), stopped by its process group at the end."""

    def __init__(self, adapter: EngineAdapter, spec: ConfigurationSpec, server_log: Path, provenance_: dict):
        self.adapter, self.spec, self.log_path, self.prov = adapter, spec, server_log, provenance_
        self.api = adapter.api(spec)
        # the health probes in order (the first that answers 200 is used), or the configured path alone
        self.health_paths = (spec.server["health_path"],) if spec.server.get("health_path") else self.api.health_paths
        self.health_path: str | None = None  # the one chosen at start-up
        # the engine's code as installed (its identity: version, build, torch; EngineAdapter.installed_build)
        self.build = adapter.installed_build(spec) if adapter.managed else None
        self.version = (self.build or {}).get("version")
        self.server = None
        self.base: str | None = None
        self.source = None
        self.random_weights = bool(spec.model.get("random_weights"))
        self.starts = 0
        self.planned = 0  # starts that followed a planned stop (pause), not a fault: not restarts
        self.preflight_done = False
        # called once, the first time the server is up and primed (the metronome's first reading: measure.metronome)
        self.on_ready: Callable[[], None] | None = None
        # a model.tokenizer that is not there, or documents to cut prompts from with no tokenizer to cut them with, is a
        # config error, before any server starts
        known = tokenizer_path(spec.model)[0] is not None
        if source_path(spec.protocol.get("text_source", STDLIB)) and not known and adapter.tokenizer(spec) is None:
            raise ConfigError(f"config key 'protocol.text_source': configuration {spec.name!r} cannot cut prompts from "
                              f"{spec.protocol['text_source']!r}: {NO_TOKENIZER}; or set protocol.text_source: random")
        self.prompter: Prompter | None = None  # decided by the prompt probe once the server first answers
        self.api_key = spec.api_key()  # unset variable: a config error, before any server starts
        self.headers = spec.auth_headers()  # every client of this server sends them (measure.load's too)
        self.client = timed_client(headers=self.headers)
        self.prov.update(installed_version=self.version, engine_build=self.build, api=self.api.kind,
                         flush_path=self.api.flush_path,
                         server_log=str(server_log) if adapter.managed else spec.server_log, starts=0,
                         listen=spec.server["host"] if adapter.managed else None,
                         # where an external server computes is its configuration's word (remote by default), known
                         # before it answers; a managed one's, from its flags and installation, once it is up
                         **({} if adapter.managed else {"device": adapter.device(spec)}))
        if adapter.managed:  # a server an earlier run of this configuration left behind (its bench was killed)
            stray = reap_stray(pid_file(server_log), spec.server["stop_timeout_s"])
            if stray:
                progress.warning("%s: %s", spec.name, stray)
                self.prov["stray_server"] = stray

    def up(self) -> None:
        if self.server is not None and self.server.alive():
            return
        self.down()
        limit = 1 + self.spec.server["max_restarts"] + self.planned
        last = None
        causes: dict[str, int] = {}  # each start-up failure's cause (the server log's, process.root_cause): its first start
        while self.starts < limit:
            self.starts += 1
            progress.info("%s: %s%s", self.spec.name, "starting the server" if self.adapter.managed
                          else f"connecting to the external server at {mask_url(self.spec.url)}",
                          f" (attempt {self.starts} of at most {limit})" if self.starts > 1 else "")
            try:
                self._start()
                self._probe()
                self._prime()
            except (FatalServerError, NoHealthPath):
                raise
            except ServerError as exc:
                last = self.scrub(str(exc))
                cause = getattr(self.server, "cause", None)
                self.down()
                if will_not_pass(cause):  # a missing file, a flag the engine does not take: the same at every start
                    raise FatalServerError(f"{last}; no restart can change that cause: the server is not started again "
                                           f"(fix the configuration, then run the same command)") from None
                if cause is not None and cause in causes:  # said once, with its log, at the start it first came
                    progress.warning("%s: start %d of at most %d failed: the same cause as start %d: %s", self.spec.name,
                                     self.starts, limit, causes[cause], self.scrub(cause))
                else:
                    progress.warning("%s: start %d of at most %d failed: %s", self.spec.name, self.starts, limit, last)
                if cause is not None:
                    causes.setdefault(cause, self.starts)
                continue
            ready, self.on_ready = self.on_ready, None
            if ready is not None:
                ready()
            return
        raise ServerError((f"the server could not be (re)started after {self.starts} starts" if self.adapter.managed
                           else f"the external server at {mask_url(self.spec.url)} failed {self.starts} times") + f"; last: {last}")

    def _start(self) -> None:
        a, spec = self.adapter, self.spec
        timeout = spec.startup_timeout_s or spec.server["startup_timeout_s"]
        if a.managed:
            cmd, startup_s = self._start_managed(timeout)
        else:
            cmd, self.base = None, spec.base_url().rstrip("/")  # its user and password go in the headers only
            self.server = ExternalServer(self.base, self.headers)
            try:
                self.health_path, startup_s = self.server.wait_ready(self.health_paths, timeout)
            except ServerError as exc:  # longctx cannot start it: a restart would only wait again
                hint = ("; it refuses requests without an API key (HTTP 401/403): name the environment variable that "
                        f"holds it in configurations.{spec.name}.api_key_env"
                        if not self.api_key and _UNAUTHORIZED.search(str(exc)) else "")
                raise FatalServerError(f"the external server of configuration {spec.name!r} (configurations."
                                       f"{spec.name}.url: {mask_url(spec.url)}) is not ready: {self.scrub(str(exc))}{hint}",
                                       may_pass=not _UNAUTHORIZED.search(str(exc))) from None
        progress.info("%s: server up in %.1f s (pid %s, %s), health on %s", spec.name, startup_s, self.server.pid,
                 self.log_path if a.managed else self.base, self.health_path)
        host = spec.server["host"]
        if a.managed and not is_loopback(host):  # server.allow_remote: said where the user looks, each start
            progress.warning("%s: the server listens on %s, port %s: reachable from the network while it runs "
                             "(server.allow_remote: true)%s", spec.name, listen_words(host), httpx.URL(self.base).port,
                             "; it asks for the API key" if self.api_key else
                             "; with no API key, whoever reaches it can send it requests")
        info = fetch_server_info(self.client, self.base, self.api)
        log_text = self._log_text()
        reports = a.server_reports(info, log_text)
        tele = telemetry_source(a, spec, self.server.pid, self.base)
        self.source = tele.source
        self.random_weights = bool(spec.model.get("random_weights") or info.get("random_weights"))
        self.prov.update(
            launch_command=mask_argv(cmd), base_url=self.base, server_pid=self.server.pid, startup_s=startup_s, starts=self.starts,
            health_path=self.health_path,
            server_info=mask(info), engine_version=info.get("version") or self.version,
            kv_pool={"tokens": a.pool_tokens(info), "log": a.kv_pool_from_log(log_text), "budget": a.kv_budget(spec)},
            telemetry=tele.description, telemetry_scope=tele.scope(), device=tele.device,
        )
        if reports:  # what the server said of itself (its KV dtype, its weights' type) revises the model as served
            self.prov.update(server_reports=reports, **model_provenance(a, spec, reports))

    def _log_text(self) -> str:
        """The server's log: longctx's own for a managed server, else the one configurations.<name>.server_log names
        (an external server's, kept by its owner; '' where none is named or it cannot be read, which is said)."""
        path = self.log_path if self.adapter.managed else (Path(self.spec.server_log) if self.spec.server_log else None)
        if path is None:
            return ""
        try:
            return path.read_text(errors="replace")
        except OSError as exc:
            progress.warning("%s: configurations.%s.server_log cannot be read (%s): what the server reports of itself "
                             "there is not known", self.spec.name, self.spec.name, exc)
            self.prov["server_log_unread"] = str(exc)
            return ""

    def _probe(self) -> None:
        """Once per sweep: how this server takes prompts and counts tokens (measure.prompts)."""
        if self.prompter is not None:
            return
        spec = self.spec
        try:
            plan, self.prompter = prompt_probe(self.client, self.base + self.api.generate_path, self.api.kind,
                                               self.adapter.served_model(spec), spec.protocol, spec.model,
                                               spec.protocol["request_timeout_s"], self.adapter.tokenizer(spec))
            if isinstance(self.prompter.source, DocumentText):
                longest, seed = longest_prompt(spec), spec.protocol["seed"]
                # a source too short for the longest prompt: said now, before any length is measured half
                self.prompter.source.body(max(0, longest - HEAD_TOKENS), seed)
                plan.text_source.update(self.prompter.source.describe(longest, seed))  # how much of it that prompt reads
        except (PromptError, TextSourceError) as exc:  # the same server would answer the same: no restart helps
            raise FatalServerError(f"the prompt probe of configuration {spec.name!r} failed: {exc}",
                                   may_pass=may_pass(str(exc))) from None
        self.prov["prompt_probe"] = plan.to_dict()
        progress.info("%s: prompt probe: %s", spec.name, plan.describe())

    def _prime(self) -> None:
        prime(self)

    def _start_managed(self, timeout: float) -> tuple[list[str], float]:
        """Launch on a free port; when another process takes that port first (another bench job
        on the node), launch again on another, up to PORT_ATTEMPTS times: that is not a restart."""
        a, spec = self.adapter, self.spec
        host = spec.server["host"]
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port(host)
            self.base = f"http://{host}:{port}"
            cmd = a.launch_command(spec, host, port, self.version)
            if not self.preflight_done:
                problem = a.preflight(spec, cmd)
                if problem:
                    raise FatalServerError(problem)
                self.preflight_done = True
            private = Path(tempfile.mkdtemp(prefix="longctx-key-")) if self.api_key else None  # 0700: this user's
            keyed, env = a.with_api_key(cmd, server_env(spec), self.api_key, private)
            # the key out of the server's log as it is written (SGLang prints its server_args)
            self.server = ManagedServer(keyed, self.log_path, env=env, stop_timeout_s=spec.server["stop_timeout_s"],
                                        unset=THREAD_LIMIT_VARS, secrets=(self.api_key,) if self.api_key else ())
            self.server.start()
            try:
                self.health_path, startup_s = self.server.wait_ready(self.base, self.health_paths, timeout, port=port,
                                                                     headers=self.headers)
                return keyed, startup_s  # recorded masked
            except PortTaken as exc:
                log.warning("%s: %s; launching on another port (%d of %d)", spec.name, exc, attempt, PORT_ATTEMPTS)
            finally:  # read by now (SGLang parses its flags before it loads a model), or never to be
                if private is not None:
                    shutil.rmtree(private, ignore_errors=True)
        raise ServerError(f"every one of {PORT_ATTEMPTS} ports was taken by another process before the server bound it")

    def refuses(self, length: int, output_tokens: int) -> str | None:
        """Why a request of `length` prompt and output_tokens output tokens cannot be served, from what the
        server reported at start-up (its context length, its KV pool's tokens), or None."""
        info = self.prov.get("server_info") or {}
        models = info.get("data") if isinstance(info.get("data"), list) else []
        try:
            context = self.adapter.context_length(self.spec.args, info)
        except (TypeError, ValueError):
            context = None
        context = context or next((m.get("max_model_len") for m in models if isinstance(m, dict) and m.get("max_model_len")), None)
        pool, _ = observed_pool(self.prov)
        need = length + output_tokens
        if context and need > int(context):
            return (f"not sent: {length} prompt and {output_tokens} output tokens exceed the context length of "
                    f"{int(context)} tokens the server reports")
        if pool and need > int(pool):
            return (f"not sent: {length} prompt and {output_tokens} output tokens exceed the {int(pool)} tokens of the KV "
                    "pool the server allocated")
        return None

    def flush(self, timeout_s: float) -> str | None:
        """Empty the server's prefix cache where its API has a flush path: None, or why it failed."""
        if not self.api.flush_path:
            return None
        try:
            r = self.client.post(self.base + self.api.flush_path, timeout=min(30.0, timeout_s))
            return None if r.status_code == 200 else f"flush_cache answered HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            return f"flush_cache failed: {exc}"

    def restarts_left(self) -> bool:
        """Whether the server may be started again (within server.max_restarts)."""
        return self.starts < 1 + self.spec.server["max_restarts"] + self.planned

    def pause(self) -> None:
        """Stop the server for now, as planned (an A/B whose sides cannot share the device): its next start is not
        a restart after a fault, so it does not count against server.max_restarts."""
        if self.alive():
            self.down()
            self.planned += 1

    def alive(self) -> bool:
        return self.server is not None and self.server.alive()

    def healthy(self) -> bool:
        """Alive and answering the health path chosen at start-up within a few seconds."""
        if not self.alive():
            return False
        try:
            return self.client.get(self.base + self.health_path, timeout=HEALTH_TIMEOUT_S).status_code == 200
        except httpx.HTTPError:
            return False

    def fault(self, during: str, then: str) -> str:
        """Why a server that failed its health check `during` something failed (it died, or it stopped
        answering its health path), in words with its log's path; the server is stopped, so that `then`
        (the next length, the next point) starts it again."""
        deadline = time.monotonic() + EXIT_GRACE_S  # a killed server's exit may not be seen yet when its socket is gone
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.alive():
            reason = (f"the server stopped answering {self.health_path} {during}; it is restarted for {then}; "
                      f"server log: {self.log_path}")
        else:
            reason = self.server.died_message(f"the server died {during}")
        self.down()
        return self.scrub(reason)

    def scrub(self, text: str) -> str:
        """text without the API key (a server's log may print its own flags: SGLang's server_args line) or what the
        URL carries (its password)."""
        return scrub(text, self.api_key, *self.spec.url_secrets())

    def down(self) -> None:
        if self.server is not None and self.adapter.managed:
            self.server.stop()
            if self.api_key and self.log_path.exists():  # the log is ours: it keeps no key once the server is down
                text = self.log_path.read_text(errors="replace")
                if self.api_key in text:
                    self.log_path.write_text(self.scrub(text))
        self.server = None

    def close(self) -> None:
        self.client.close()  # first: a server waits for its open responses before it exits
        self.down()
