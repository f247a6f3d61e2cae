"""cistern: the native client of a cistern cluster for Python.

    import cistern
    fs = cistern.connect()                    # $CISTERN_CLUSTER, else 127.0.0.1:7420
    with fs.open("/data/a.bin", "wb") as f:
        f.write(b"...")
    buf = bytearray(4096)
    with fs.open("/data/a.bin") as f:
        n = f.readinto(buf)                   # no copy through Python objects

Files behave like Python's binary files (read, readinto, write, seek, tell,
pread, context manager); errors are OSError subclasses (FileNotFoundError,
PermissionError, ...) with errno, strerror and filename set. Every call that
talks to the cluster releases the GIL, so threads (and DataLoader workers)
overlap their I/O.
"""
import os as _os
import stat as _stat

from ._cistern import Client as _Client
from ._cistern import File
from ._cistern import Pack
from ._cistern import metrics
from ._cistern import webdataset_name

__all__ = ["connect", "Connection", "File", "DirEntry", "Pack", "metrics", "webdataset_name"]


class DirEntry:
    """One entry of scandir(), as os.DirEntry: its stat came with the listing."""

    __slots__ = ("name", "path", "_stat")

    def __init__(self, parent, name, st):
        self.name = name
        self.path = parent.rstrip("/") + "/" + name
        self._stat = st

    def is_dir(self, follow_symlinks=True):
        return _stat.S_ISDIR(self._stat.st_mode)

    def is_file(self, follow_symlinks=True):
        return _stat.S_ISREG(self._stat.st_mode)

    def is_symlink(self):
        return _stat.S_ISLNK(self._stat.st_mode)

    def stat(self, follow_symlinks=True):
        return self._stat

    def inode(self):
        return self._stat.st_ino

    def __fspath__(self):
        return self.path

    def __repr__(self):
        return "<cistern.DirEntry %r>" % self.name


class Connection(_Client):
    """A connection to a cluster (cistern.connect())."""

    def scandir(self, path="/"):
        """The entries of a directory with their attributes, in name order."""
        return [DirEntry(path, name, st) for name, _, st in self.scandir_raw(path)]

    def walk(self, top="/", topdown=True):
        """os.walk over the cluster's tree: (dirpath, dirnames, filenames)."""
        try:
            entries = self.scandir(top)
        except OSError:
            return
        dirs = [e.name for e in entries if e.is_dir()]
        files = [e.name for e in entries if not e.is_dir()]
        if topdown:
            yield top, dirs, files
        for d in dirs:
            yield from self.walk(top.rstrip("/") + "/" + d, topdown)
        if not topdown:
            yield top, dirs, files

    def isdir(self, path):
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except OSError:
            return False

    def isfile(self, path):
        try:
            return _stat.S_ISREG(self.stat(path).st_mode)
        except OSError:
            return False


def connect(cluster=None, retry_ms=0, token=None):
    """Connects to the cluster at `cluster` ("host:port", or several mgmtd
    "host:port,host:port"); None: $CISTERN_CLUSTER, else 127.0.0.1:7420.
    `retry_ms`: how long transient errors are retried (0: the library's
    default, 10 s). `token`: the tenant token its calls carry (None:
    $CISTERN_TOKEN, else none; docs/security.md)."""
    return Connection(cluster or _os.environ.get("CISTERN_CLUSTER", ""), retry_ms, token or "")
