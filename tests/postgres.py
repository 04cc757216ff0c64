"""A real PostgreSQL server for the tests: Debian's package (`make test` installs it), a fresh cluster on a free port.

The cluster lives in a temp directory and listens on 127.0.0.1 only; as root it runs as the
`postgres` user, since the server refuses to run as root. It is stopped when the block ends.
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
    base, _, _ = server.rpartition("/")
    admin = psycopg2.connect(f"{base}/postgres")
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    return f"{base}/{name}"


@contextlib.contextmanager
def running_postgres() -> Iterator[str]:
    """A started server with an empty database; its URL."""
    bin_dir, port = binaries(), free_port()
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    directory = Path(tempfile.mkdtemp(prefix="factory-postgres-", dir="/tmp"))
    if as_root:
        shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"

    def run(*argv: str) -> None:
        done = subprocess.run([*run_as, *argv], capture_output=True, text=True, cwd=directory)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")

    run(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "--no-sync")
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(directory / "server.log"), "-w", "start")
    try:
        admin = psycopg2.connect(host="127.0.0.1", port=port, user=USER, dbname="postgres")
        admin.autocommit = True
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {DATABASE}")
        admin.close()
        yield f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"
    finally:
        subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    with running_postgres() as url:
        print(url, getpass.getuser())
