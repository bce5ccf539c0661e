"""Reading the JSON records conccl writes (study results, hardware profiles), one way; writing
any output file whole or not at all."""
from __future__ import annotations

import json
import os
import pathlib
import tempfile


def read_json(path, error: type[Exception], what: str):
    """The parsed JSON of ``path``; ``error`` (naming ``what`` and the path) when the file
    cannot be read, is not UTF-8 text or is not JSON."""
    path = pathlib.Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"cannot read {what} {str(path)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def write_text(path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then a rename, so an
    interrupted or failed write never leaves half a file that a rerun would trip over."""
    p = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
