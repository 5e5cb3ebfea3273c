"""Blob files on disk: streaming ``export_model`` into a file without holding the blob
in Python memory, mapping a stored blob back for ``import_model``, and the throwaway
cache a compile exports into.
"""

from __future__ import annotations

import contextlib
import errno
import io
import locale
import logging
import mmap
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ovspec.store.local import PayloadWriteError

log = logging.getLogger(__name__)


class FileSink(io.BytesIO):
    """``export_model`` accepts only a BytesIO; this one forwards to a real file, so a
    large blob never sits whole in Python memory (+16 MiB instead of +blob size).

    OpenVINO swallows an exception raised by the stream it writes to and returns as if
    the export succeeded, leaving a short file (disk full, RLIMIT_FSIZE and EIO each
    published a truncated blob). So the sink records its first error and the byte count
    itself, and ``finish`` turns either into a ``PayloadWriteError``.
    """

    def __init__(self, file: io.BufferedWriter) -> None:
        super().__init__()
        self._file = file
        self.error: OSError | None = None
        self.bytes_written = 0  # the high-water mark of the file position

    def _fail(self, exc: BaseException) -> OSError:
        if self.error is None:
            self.error = exc if isinstance(exc, OSError) else OSError(errno.EIO, str(exc))
        return self.error

    def write(self, data: Any) -> int:
        if self.error is not None:
            raise self.error  # stop the export early; it ignores the failure anyway
        try:
            n = self._file.write(data)
            self.bytes_written = max(self.bytes_written, self._file.tell())
        except BaseException as exc:
            raise self._fail(exc) from exc
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return self._file.seek(offset, whence)
        except BaseException as exc:
            raise self._fail(exc) from exc

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        try:
            self._file.flush()
        except BaseException as exc:
            raise self._fail(exc) from exc

    def finish(self) -> int:
        """Flush and fsync; the payload's size, or PayloadWriteError if any write failed
        or the file is not as long as what was written."""
        if self.error is None:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as exc:
                self._fail(exc)
        if self.error is not None:
            err = self.error
            raise PayloadWriteError(
                err.errno or errno.EIO, f"export failed: {err.strerror or err}"
            ) from err
        size = os.fstat(self._file.fileno()).st_size
        if size != self.bytes_written:
            raise PayloadWriteError(
                errno.EIO, f"export wrote {self.bytes_written} bytes but the file has {size}"
            )
        return size


def map_file(path: Path) -> mmap.mmap:
    """A copy-on-write mapping of a whole file (it stays valid after the file is removed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


@contextlib.contextmanager
def throwaway_cache(wanted: bool) -> Iterator[dict[str, str]]:
    """``{"CACHE_DIR": a new temporary folder}`` while open, removed after; ``{}`` if not
    ``wanted`` or no folder can be made. OpenVINO exports a graph compiled with a
    ``CACHE_DIR`` inside ``compile_model``, which releases the GIL; the Python binding
    holds it through ``export_model`` (docs/npu.md)."""
    if not wanted:
        yield {}
        return
    try:
        folder = tempfile.TemporaryDirectory(prefix="ovspec-export-")
    except OSError as exc:  # then the export does it all, GIL held
        log.debug("compiling without a throwaway cache: %s", exc)
        yield {}
        return
    # NPUW exporting into a cache leaves the process in the C locale (seen on 2026.4):
    # Python would then decode a subprocess's UTF-8 output as ASCII. Put it back.
    saved = locale.setlocale(locale.LC_ALL)
    try:
        with folder:
            yield {"CACHE_DIR": folder.name}
    finally:
        locale.setlocale(locale.LC_ALL, saved)
