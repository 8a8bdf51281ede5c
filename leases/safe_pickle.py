"""Reading django-q2's pickled columns without running them (issue 25).

django-q2 keeps a finished task's `args`, `kwargs` and `result` as pickles (django-picklefield: base64 of
a pickle) in `django_q_task`, **unsigned**: whoever can write that table can store a pickle that runs
code when it is loaded, and the ORM loads it as soon as a row is fetched. The admin pages of those rows
(leases/admin_q.py) therefore never let the ORM decode them: they read the column's text and decode it
here, with an unpickler that resolves no global at all, so a pickle can only build plain values (None,
booleans, numbers, strings, bytes, lists, tuples, dicts, sets) and anything else, a class or a callable
included, is refused before it is looked up. A value refused is shown as such, and not resubmitted.
"""

from __future__ import annotations

import base64
import io
import pickle
import zlib
from typing import Any


class UnsafePickle(ValueError):
    """The column holds a pickle that is not plain data (it names a class or a callable), or no pickle."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # every global: a class, a function, a reducer
        raise UnsafePickle(f"the pickle names {module}.{name}; only plain values are decoded")

    def persistent_load(self, pid):
        raise UnsafePickle("the pickle holds a persistent id; only plain values are decoded")


def plain_value(text: str | None, *, compressed: bool = False) -> Any:
    """The plain value a picklefield column's text holds; UnsafePickle if it is anything else."""
    if text is None:
        return None
    try:
        data = base64.b64decode(text.encode(), validate=True)
        if compressed:
            data = zlib.decompress(data)
        return _PlainUnpickler(io.BytesIO(data)).load()
    except UnsafePickle:
        raise
    except Exception as exc:  # no global is ever resolved, so whatever else fails is bad data (found by hypothesis:
        # binascii.Error, zlib.error, UnpicklingError, EOFError, OverflowError on a forged length, ...)
        raise UnsafePickle(f"not a pickle of plain values: {type(exc).__name__}") from None
