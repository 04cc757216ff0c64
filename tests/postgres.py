"""A real PostgreSQL server for the tests: Debian's package (`make test` installs it), a fresh cluster on a free port.

The cluster lives in a temp directory (or one it is given and kept in: bench/scale.py's histories) and listens on
127.0.0.1 only; as root it runs as the `postgres` user, since the server refuses to run as root (a kept directory must
be reachable by that user). It is stopped when the block ends.
"""

import contextlib
import getpass
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2

from tests.ports import free_port

DATABASE = "factory"
USER = "factory"


def binaries() -> Path:
    """The directory of initdb and pg_ctl (Debian puts them under /usr/lib/postgresql/<version>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: `make test` installs Debian's postgresql package (make services)")
    return Path(found[-1]).parent


def fresh_database(server: str, name: str) -> str:
    """A new, empty database on the server at `server` (a URL running_postgres gave); its URL."""
    return database(server, name, keep=False)


def database(server: str, name: str, keep: bool) -> str:
    """The database `name` on the server at `server` (a URL running_postgres gave), its URL: with `keep`, as it is if it
    exists (made empty if not); else made again, empty."""
    base, _, _ = server.rpartition("/")
    admin = psycopg2.connect(f"{base}/postgres")
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        exists = cursor.fetchone() is not None
        if exists and not keep:
            cursor.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        if not (exists and keep):
            cursor.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    return f"{base}/{name}"


@contextlib.contextmanager
def running_postgres(kept: Path | None = None) -> Iterator[str]:
    """A started server with the database `factory` (empty on a new cluster); its URL. With `kept`, the cluster lives in
    that directory and stays there when the block ends (made the first time, started again later with its databases as
    they were): a fixture built once and reused, as bench/scale.py's histories are."""
    bin_dir, port = binaries(), free_port()
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    directory = Path(tempfile.mkdtemp(prefix="factory-postgres-", dir="/tmp")) if kept is None else kept.resolve()
    data = directory / "data"
    made = (data / "PG_VERSION").exists()
    directory.mkdir(parents=True, exist_ok=True)
    if as_root:
        shutil.chown(directory, "postgres", "postgres")

    def run(*argv: str) -> None:
        done = subprocess.run([*run_as, *argv], capture_output=True, text=True, cwd=directory)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")

    if not made:
        run(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "--no-sync")
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(directory / "server.log"), "-w", "start")
    try:
        url = f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"
        if not made:
            database(url, DATABASE, keep=True)
        yield url
    finally:
        subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)
        if kept is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    with running_postgres() as url:
        print(url, getpass.getuser())
