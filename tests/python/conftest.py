"""A `cistern up` for the Python tests: started once per session on free
ports in a temporary directory, stopped after (CISTERN_BIN names the binary,
PYTHONPATH the built module: python/CMakeLists.txt sets both)."""
import os
import subprocess
import tempfile
import threading

import pytest


@pytest.fixture(scope="session")
def cluster():
    binary = os.environ["CISTERN_BIN"]
    data = tempfile.mkdtemp(prefix="cistern-py-")
    proc = subprocess.Popen(
        [binary, "up", "--data", data, "--listen", "127.0.0.1:0"],
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
    yield address
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    subprocess.run(["rm", "-rf", data])


@pytest.fixture()
def fs(cluster):
    import cistern
    return cistern.connect(cluster)
