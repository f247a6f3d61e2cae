"""A `cistern up --mount` for the Python tests: started once per session on
free ports in a temporary directory, mounted there, stopped (and unmounted)
after (CISTERN_BIN names the binary, PYTHONPATH the built module:
python/CMakeLists.txt sets both)."""
import os
import subprocess
import tempfile
import threading

import pytest


def start_up(root, extra=()):
    """`cistern up --mount` in directory `root` (extra: more flags); returns
    (process, address, mountpoint) once it is ready."""
    binary = os.environ["CISTERN_BIN"]
    data, mnt = os.path.join(root, "data"), os.path.join(root, "mnt")
    os.mkdir(mnt)
    proc = subprocess.Popen(
        [binary, "up", "--data", data, "--listen", "127.0.0.1:0", "--mount", mnt, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    address, ready, log = None, False, ""
    # Blocking reads (a select() on the buffered pipe would miss lines
    # already read ahead), bounded by a watchdog that kills a silent start.
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    while not ready:
        line = proc.stdout.readline()
        if not line:
            break
        log += line
        if line.startswith("cistern up: cluster "):
            address = line.split()[3]
        ready = "cistern up: ready" in line
    watchdog.cancel()
    if address is None or not ready:
        proc.kill()
        raise RuntimeError("cistern up did not start:\n" + log)
    # Its output drained from now on: a full pipe would stop the process.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, address, mnt


def stop_up(proc, root):
    """Stops what start_up() started and removes `root`."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    subprocess.run(["umount", "-l", os.path.join(root, "mnt")], stderr=subprocess.DEVNULL)
    subprocess.run(["rm", "-rf", root])


@pytest.fixture(scope="session")
def _up():
    root = tempfile.mkdtemp(prefix="cistern-py-")
    proc, address, mnt = start_up(root)
    yield address, mnt
    stop_up(proc, root)


@pytest.fixture(scope="session")
def cluster(_up):
    """The cluster's address (host:port)."""
    return _up[0]


@pytest.fixture(scope="session")
def mnt(_up):
    """Where the cluster is mounted."""
    return _up[1]


@pytest.fixture()
def fs(cluster):
    import cistern
    return cistern.connect(cluster)
