"""Following a git remote: a bare clone of the sensor's own, fetched with a timeout and never a prompt; the user's
checkout is never touched. Credentials are git's own (an ssh key through GIT_SSH_COMMAND, a credential helper)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from factory.errors import FactoryError

FETCH_TIMEOUT_S = 60
TIP_REF = "refs/factory/tip"  # where the fetched branch lands in the clone; no branch is ever checked out
_AUTH = re.compile(r"authentication failed|permission denied|could not read (username|password)|terminal prompts disabled"
                   r"|returned error: 40[13]\b|\b40[13] (forbidden|unauthorized)|invalid credentials|host key verification failed",
                   re.IGNORECASE)
"""What git says when a remote refuses credentials; an HTTP status only where git gives one (a bare `401` also matches a
path such as pytest's `pytest-401` directory)."""


class RemoteError(FactoryError):
    """The git remote could not be fetched; the message says what to change."""


def fetch_branch(remote: str, branch: str, clone: str | Path, timeout_s: float = FETCH_TIMEOUT_S) -> str:
    """Fetch `branch` of `remote` into the bare repository `clone` (created on first use); the fetched commit's sha."""
    clone = Path(clone)
    if not (clone / "HEAD").exists():
        clone.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "--bare", "-q", str(clone)], check=True, capture_output=True, timeout=timeout_s)
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # bad credentials fail instead of waiting on a prompt nobody sees
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    command = ["git", "fetch", "--quiet", "--no-tags", "--force", remote, f"+refs/heads/{branch}:{TIP_REF}"]
    try:
        subprocess.run(command, cwd=clone, env=env, check=True, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise RemoteError(f"fetching {branch!r} from {remote} took over {timeout_s:.0f} s: check FACTORY_GIT_REMOTE and "
                          "the network") from e
    except subprocess.CalledProcessError as e:
        raise RemoteError(_explain(remote, branch, e.stderr or "")) from e
    return _git(clone, "rev-parse", "--verify", f"{TIP_REF}^{{commit}}")


def _explain(remote: str, branch: str, stderr: str) -> str:
    last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "git fetch failed")
    if "couldn't find remote ref" in stderr:
        return f"branch {branch!r} does not exist on {remote}: set FACTORY_GIT_BRANCH to an existing branch (git said: {last})"
    if _AUTH.search(stderr):
        return (f"{remote} refused the credentials: give git a key (GIT_SSH_COMMAND='ssh -i KEY') or a token through a "
                f"credential helper, then check with `git ls-remote {remote}` (git said: {last})")
    return f"cannot reach {remote}: check FACTORY_GIT_REMOTE (a URL or a path) and the network (git said: {last})"


def is_ancestor(clone: str | Path, old: str, new: str) -> bool:
    """Whether `old` is in `new`'s history; False when `old` is unknown (e.g. rewritten away by a force-push)."""
    result = subprocess.run(["git", "merge-base", "--is-ancestor", old, new], cwd=clone, capture_output=True, timeout=30)
    return result.returncode == 0


def bringing_commit(clone: str | Path, commit: str, path: str) -> str:
    """The commit on `commit`'s first-parent line that brought `path` (a pull request's merge commit, or a direct commit)."""
    return _git(clone, "log", "--first-parent", "-1", "--format=%H", commit, "--", path) or commit


def file_url(remote: str, commit: str, path: str) -> str | None:
    """A browsable URL of `path` at `commit` when `remote` is an http(s) GitHub/GitLab-like URL; None otherwise."""
    if not remote.startswith(("https://", "http://")):
        return None
    parts = urlsplit(remote.rstrip("/").removesuffix(".git"))
    base = urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))  # no user:token
    return f"{base}/blob/{commit}/{path}"


def _git(cwd: str | Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30).stdout.strip()
