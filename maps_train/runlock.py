"""One writer per run folder: the lock a long run holds while it writes (`sole_writer`).

Every stage that writes a run folder holds it: `run` (and every run of `traces`, `eval` and `distill-on-policy`,
through `run_method`), `eval` on the suite's folder, `train` on each adapter's trainer folder, `rl` on
`rl.output_dir`, `distill-on-policy` on its folder, and `index build` on the index folder. The lock is an
exclusive `flock` on `<folder>/.lock`: the kernel releases it when the process ends, however it ends, so a lock
file left behind by a killed run never blocks the next one. The file is opened without following a symbolic link
(a link there is refused, never truncated through) and must be a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from pathlib import Path

from maps_train.errors import MapsTrainError, os_error_line

LOCK_FILE = ".lock"
_HOLDER_BYTES = 512  # what is read back of a holder's line


def _open_lock(path: Path) -> int:
    """The lock file's descriptor: created if absent, never through a symbolic link, never blocking (a FIFO put
    there), and only a regular file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise MapsTrainError(f"{path}: is a symbolic link; a run's lock file is never followed (remove the "
                                 "link)") from None
        raise MapsTrainError(os_error_line(err, path, "open the run's lock")) from err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise MapsTrainError(f"{path}: not a regular file; a run's lock must be one (remove what is there)")
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def sole_writer(folder: Path, what: str, name: str = LOCK_FILE):
    """Hold `<folder>/<name>` (an exclusive `flock`, released by the kernel when the process ends, killed or not)
    while a long run writes into `folder`; a second run into the same folder is a one-line error naming the holder
    (its pid, host and `what`) instead of two runs interleaving their records or checkpoints. `name` is another
    file than `.lock` where what is locked is one of several things in the folder (an adapter's training, an index
    beside others) or a folder that the run itself may remove."""
    import fcntl

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MapsTrainError(os_error_line(err, folder, "create the output folder")) from err
    path = folder / name
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            written = os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", "replace").splitlines()
            pid = written[0].strip() if written and written[0].startswith("pid ") else "pid unknown"
            holder = written[1].strip() if len(written) > 1 and written[1].strip() else "another run"
            raise MapsTrainError(f"{folder}: {holder} is already writing here ({pid}); wait for it to end or use "
                                 f"another output folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n{what} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
