"""The collectives' work objects, held past their completion so that gloo's worker thread does not
free them while the interpreter finalizes (the reason below); the dist engine and the DDP comm
hook of :mod:`gossamer.integrations` retain every work they start.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import threading
import time

# The collectives' work objects, held here so that gloo's worker thread does not drop the last
# reference to one while the interpreter finalizes: a work destroyed on that thread frees its
# tensors' Python objects, which takes the GIL — and a thread that takes the GIL while the
# interpreter finalizes is ended inside a C++ destructor: "terminate called without an active
# exception" (docs/distributed.md). gloo's thread lets go of a work only after wait() has returned
# (it marks the work completed, then does its bookkeeping, takes its queue lock and drops its
# reference; measured: in 2-3 % of collectives it still holds the work when the *next* collective
# has returned, for up to a few ms on loaded cores). So every work is held from its start; the
# engine frees the finished ones on the main thread at the start of its next collective
# (`release_works`), so a finished collective's tensors live until then (within the next step of a
# loop that calls the engine every step), and where gloo's thread still holds one, that thread
# frees it, harmlessly, while the program runs. At exit whatever is held is leaked (never freed:
# the OS reclaims it), and if works were released less than `_EXIT_GRACE` seconds before, the
# main thread sleeps out the rest (the GIL released) before the interpreter finalizes, so that
# gloo's thread is done with them. The bound only matters for works retained where no engine
# collective follows (the DDP comm hook's, which hold DDP's own bucket buffers): the oldest goes.
_RECENT_WORK: collections.deque = collections.deque(maxlen=1024)
_EXIT_GRACE = 0.1  # seconds: ~25× the longest lag measured with 2 cores busy with other processes
_released_at = -float("inf")  # time.monotonic() of the last release that freed works


def retain(work) -> None:
    """Hold a collective's ``work`` past its completion (see ``_RECENT_WORK``)."""
    _RECENT_WORK.append(work)


def release_works() -> None:
    """Free the held works of finished collectives (see ``_RECENT_WORK``); unfinished ones stay.
    Only on a thread the interpreter joins before it finalizes (the main thread, a non-daemon
    thread): freeing a work takes the GIL again inside its C++ destructor."""
    global _released_at
    if threading.current_thread().daemon:
        return
    pending = [w for w in _RECENT_WORK if not w.is_completed()]
    if len(pending) < len(_RECENT_WORK):
        _RECENT_WORK.clear()  # the finished works are destroyed here (or by gloo's thread, a moment later)
        _RECENT_WORK.extend(pending)
        _released_at = time.monotonic()


@atexit.register
def _leak_recent_work() -> None:
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_RECENT_WORK))
    time.sleep(max(0.0, _released_at + _EXIT_GRACE - time.monotonic()))  # atexit runs before finalization
