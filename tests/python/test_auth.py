"""Tokens, tenants and quotas from Python (docs/security.md, docs/quota.md),
on a `cistern up` with a key file of its own: a tenant's connection sees its
subtree as /, another tenant's files are not there, a read-only token does
not write, a quota's edge is EDQUOT, no token is refused at connect."""
import errno
import os
import subprocess
import tempfile

import pytest

import cistern
from conftest import start_up, stop_up


def cli(*args, token=None, check=True):
    env = dict(os.environ)
    env.pop("CISTERN_TOKEN", None)
    if token:
        env["CISTERN_TOKEN"] = token
    r = subprocess.run([os.environ["CISTERN_BIN"], *args], env=env, text=True,
                       capture_output=True)
    if check and r.returncode != 0:
        raise AssertionError(f"cistern {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout.strip()


@pytest.fixture(scope="module")
def secured():
    root = tempfile.mkdtemp(prefix="cistern-py-auth-")
    keys = os.path.join(root, "keys")
    with open(keys, "w") as f:
        f.write(cli("token", "keygen", "--id", "1") + "\n")
    os.chmod(keys, 0o600)
    config = os.path.join(root, "up.toml")
    with open(config, "w") as f:
        f.write(f'auth.keys_file = "{keys}"\n')
    proc, address, _ = start_up(root, ["--config", config])

    def issue(tenant, rights="rw", uid=1000):
        return cli("token", "issue", "--keys", keys, "--tenant", tenant, "--uid", str(uid),
                   "--gid", str(uid), "--rights", rights)

    admin = issue("cluster", "rwa", 0)
    cli("tenant", "create", "alpha", "--uid", "1000", "--gid", "1000", "--cluster", address,
        token=admin)
    cli("tenant", "create", "beta", "--uid", "2000", "--gid", "2000", "--cluster", address,
        token=admin)
    yield address, issue, admin
    stop_up(proc, root)


def test_a_tenant_sees_its_subtree_as_root(secured):
    address, issue, admin = secured
    alpha = cistern.connect(address, token=issue("alpha"))
    with alpha.open("/train.bin", "wb") as f:
        f.write(b"x" * 100_000)
    assert alpha.listdir("/") == ["train.bin"]
    with alpha.open("/train.bin", "rb") as f:
        assert f.read() == b"x" * 100_000
    beta = cistern.connect(address, token=issue("beta", uid=2000))
    assert beta.listdir("/") == []
    with pytest.raises(FileNotFoundError):
        beta.open("/train.bin", "rb")
    with pytest.raises(FileNotFoundError):
        beta.stat("/alpha/train.bin")
    # The admin sees it where it lives.
    everyone = cistern.connect(address, token=admin)
    assert "train.bin" in everyone.listdir("/alpha")
    assert everyone.stat("/alpha/train.bin").st_uid == 1000


def test_refusals_have_their_own_errno(secured):
    address, issue, _ = secured
    reader = cistern.connect(address, token=issue("alpha", "r"))
    with pytest.raises(OSError) as e:
        reader.open("/nope.bin", "wb")
    assert e.value.errno == errno.EROFS
    old = os.environ.pop("CISTERN_TOKEN", None)
    try:
        with pytest.raises(PermissionError, match="carried none"):
            cistern.connect(address)
    finally:
        if old is not None:
            os.environ["CISTERN_TOKEN"] = old
    ghost = cistern.connect(address, token=issue("nosuch"))  # mgmtd: any valid token
    with pytest.raises(OSError, match="which does not exist") as e:
        ghost.listdir("/")
    assert e.value.errno == errno.EKEYREJECTED


def test_a_quota_edge_is_edquot_and_nothing_acknowledged_is_lost(secured):
    address, issue, admin = secured
    cli("tenant", "set", "beta", "--bytes", "3M", "--cluster", address, token=admin)
    beta = cistern.connect(address, token=issue("beta", uid=2000))
    with beta.open("/a.bin", "wb") as f:
        f.write(b"a" * (2 << 20))
    with pytest.raises(OSError) as e:
        with beta.open("/b.bin", "wb") as f:
            f.write(b"b" * (2 << 20))
    assert e.value.errno == errno.EDQUOT
    with beta.open("/a.bin", "rb") as f:
        assert f.read() == b"a" * (2 << 20)
