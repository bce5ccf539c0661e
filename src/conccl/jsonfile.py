"""Reading the JSON records conccl writes (study results, hardware profiles), one way."""
from __future__ import annotations

import json
import pathlib


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
