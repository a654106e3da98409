"""Errors meant for people, shared by every stage."""


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which key and what is allowed."""


class WriteError(OSError):
    """A file that could not be written (disk full, read-only, no permission), with its path: an
    OSError raised while writing often names no file (ENOSPC comes from write(), not open())."""

    def __init__(self, path, exc: OSError):
        super().__init__(exc.errno, exc.strerror or str(exc), str(path))
        self.path = str(path)


def write_fix(errno_: int | None, path: str) -> str:
    """What a person does about a file that could not be written, in words."""
    import errno
    import os

    where = os.path.dirname(os.path.abspath(path)) or "."
    if errno_ in (errno.ENOSPC, errno.EDQUOT):
        return (f"free space on the disk that holds {where} (df -h {where}), then run the same command again: "
                "what was measured before is kept")
    if errno_ in (errno.EACCES, errno.EPERM):
        return f"make {where} writable for this user (ls -ld {where}; chmod u+w {where}), then run the same command again"
    if errno_ == errno.EROFS:
        return f"{where} is on a read-only file system: run from a writable checkout, or remount it read-write"
    return "check the path, then run the same command again"


def write_atomic(path, data: str | bytes) -> None:
    """path written whole through a temporary file beside it and renamed, so that no reader sees half
    of it; on failure the temporary file is removed and WriteError names path."""
    import os
    from pathlib import Path

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise WriteError(path, exc) from exc
