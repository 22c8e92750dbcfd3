"""A Ray cluster of several nodes on this one machine, to rehearse ``trainer.nnodes>1`` on a CPU.

Ray runs several raylets on one host as well as on several: each ``ray start`` here is one node, declaring as
many "GPU"s as the rehearsal puts FSDP workers on it (the CPU platform's Ray resource, ``platform.py``), so verl's
resource pool (``n_gpus_per_node`` GPUs on each of ``nnodes`` nodes) spreads its workers over the nodes exactly as
on a GPU cluster. A run joins it with ``+ray_kwargs.ray_init.address=<address>``; the driver then drops the
settings only a new cluster takes (``for_existing_cluster``, called where the rehearsal's checks run)::

    python -m recipe_apo.cpu.local_cluster start --nodes 2 --gpus-per-node 1   # prints the overrides
    python -m recipe_apo.main method=apo rehearsal=cpu <printed overrides> ...
    python -m recipe_apo.cpu.local_cluster stop

Each cluster keeps to itself, so that tests and other Ray sessions on the machine run beside it: its own temp
dir (a bare ``ray.init()`` elsewhere looks for a cluster to join in Ray's default one, /tmp/ray), free ports
where Ray's are fixed, and each node in a process group of its own, stopped by its id (``ray stop`` would stop
every Ray process on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from recipe_apo.errors import RecipeError

# What the raylets read from their environment (recipe_apo/cpu/activate.py DRIVER_ENV; a test keeps the two equal;
# importing activate here would turn the rehearsal on in this process). A raylet started by ray.init inherits
# it from the driver; these are started by `ray start`.
NODE_ENV = {"RAY_prestart_worker_first_driver": "0"}
# Ray counts CPUs only to place tasks; the machine's cores are shared whatever a node declares.
CPUS_PER_NODE = 8
# ray.init refuses these when it joins a running cluster (the cluster's nodes declared their resources).
NEW_CLUSTER_ONLY = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "include_dashboard",
                    "_system_config")
# The driver's environment a worker needs: a worker inherits its raylet's environment, and these raylets were
# started before the run, by another command. verl's file logger (in the task runner), the recipe's own
# settings (the reward pool's, the hf rollout's pacing), the warnings the rehearsal silences.
FORWARDED_ENV = ("VERL_FILE_LOGGER_ROOT", "VERL_FILE_LOGGER_PATH", "PYTHONWARNINGS")
FORWARDED_PREFIX = "RECIPE_APO_"
START_TIMEOUT_S = 120.0
# The mark `start` leaves in the temp dir it made, holding the cluster's token: `stop` removes a folder only when it
# holds the mark with the recorded token, so a record that names another folder removes nothing.
MARK = ".recipe-apo-local-cluster"
TEMP_PREFIX = "ray-apo-"


def state_file() -> Path:
    """Where the command's ``start`` records the cluster for its ``stop``: in a folder of this user's own (mode 700
    in the system's temp folder), so that another user cannot plant a record for ``stop`` to act on."""
    return Path(tempfile.gettempdir()) / f"recipe-apo-{os.getuid()}" / "local-cluster.json"


def _own_folder(path: Path, create: bool) -> None:
    """``path`` is a folder of this user's, writable by no one else (made so when ``create``); else a one-line
    ``LocalClusterError``."""
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise LocalClusterError(f"{path}: not a folder of this user's that no one else can write; remove it (or "
                                "have its owner remove it) and start the cluster again")


class LocalClusterError(RecipeError):
    """A local cluster did not start, or there is none to stop; the message says which and where to look."""


@dataclass
class LocalCluster:
    address: str
    nodes: int
    gpus_per_node: int
    temp_dir: str
    # The `ray start --block` process of each node, head first; each leads a process group holding its node's
    # Ray processes.
    pids: list[int] = field(default_factory=list)
    # A random token, also in the temp dir's mark (``MARK``): what ``stop`` checks before it removes anything.
    token: str = ""

    def overrides(self) -> list[str]:
        """What a rehearsal run adds to its command line to run on this cluster."""
        return [f"trainer.nnodes={self.nodes}", f"trainer.n_gpus_per_node={self.gpus_per_node}",
                f"+ray_kwargs.ray_init.address={self.address}"]


def for_existing_cluster(config: Any) -> None:
    """Make ``ray_kwargs.ray_init`` join the cluster at ``ray_init.address``, if one is set: drop what only a new
    cluster takes, which ray.init refuses otherwise, and forward the driver's environment that the workers need
    (``FORWARDED_ENV``) through the runtime env (the config's own ``env_vars`` win). Token authentication is
    turned on in this process when a token exists, as ray.init does for a local cluster it finds by itself but
    not for one named by its address."""
    from omegaconf import OmegaConf, open_dict

    ray_init = OmegaConf.select(config, "ray_kwargs.ray_init")
    if ray_init is None or not ray_init.get("address"):
        return
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    forwarded = {key: value for key, value in os.environ.items()
                 if key in FORWARDED_ENV or key.startswith(FORWARDED_PREFIX)}
    with open_dict(config):
        for key in NEW_CLUSTER_ONLY:
            ray_init.pop(key, None)
        env_vars = OmegaConf.select(ray_init, "runtime_env.env_vars") or {}
        OmegaConf.update(ray_init, "runtime_env.env_vars", {**forwarded, **env_vars}, merge=False)


# ---- starting and stopping ---------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))  # every interface: Ray's servers listen on all of them
        return sock.getsockname()[1]


def _ray() -> str:
    """The ``ray`` command of this Python environment: the nodes must run the driver's Ray and packages."""
    return str(Path(sys.executable).with_name("ray"))


def _node_command(address: str, head: bool, gpus: int, cpus: int, temp_dir: str) -> list[str]:
    # --block: the command stays in the foreground holding its node's processes, and stops them when it is
    # stopped (Ray's own cleanup on SIGTERM). Ray's fixed default ports (the head's client server and dashboard,
    # every node's dashboard agent, workers' 10002-19999) would clash between nodes and with other sessions. One
    # log monitor for the machine, as Ray's own test clusters run: each reads every node's logs here, and the
    # driver would print every worker's line once per node.
    command = [_ray(), "start", "--block", f"--num-gpus={gpus}", f"--num-cpus={cpus}", f"--temp-dir={temp_dir}",
               f"--dashboard-agent-listen-port={_free_port()}",
               "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats"]
    if head:
        return command + ["--head", f"--port={address.rsplit(':', 1)[1]}", f"--ray-client-server-port={_free_port()}",
                          "--include-dashboard=false", f"--dashboard-port={_free_port()}"]
    return command + [f"--address={address}", "--include-log-monitor=false"]


def _auth_env() -> dict[str, str]:
    """Token authentication for the nodes, as ``ray.init`` sets it up for a new local cluster (a token in
    ~/.ray/auth_token, made if missing), unless ``RAY_AUTH_MODE`` says otherwise. Set explicitly: ``ray start``
    turns it on by itself only on the head, and only when a token exists, and a node without it cannot join."""
    if os.environ.get("RAY_AUTH_MODE"):
        return {}
    from ray._private.authentication.authentication_token_setup import generate_and_save_token
    from ray._raylet import AuthenticationTokenLoader

    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        generate_and_save_token()
    return {"RAY_AUTH_MODE": "token"}


# What `ray start` prints once its node is up and registered with the head.
STARTED = "Ray runtime started."


def _wait_started(process: subprocess.Popen, log: Path, deadline: float) -> None:
    # The node's own output rather than a query of the cluster: a query from here would need Ray's auth set up
    # in this process (a test's, the command's).
    while STARTED not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            # The log goes with the cluster's temp dir: its last line is said here.
            last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            why = (f"exited with code {process.returncode}" if process.returncode is not None
                   else f"did not start within {START_TIMEOUT_S:.0f} s")
            raise LocalClusterError(f"a Ray node of the local cluster {why}; its last line: {last}")
        time.sleep(0.2)


def start(nodes: int = 2, gpus_per_node: int = 1, cpus_per_node: int = CPUS_PER_NODE, cwd: Optional[Path] = None,
          temp_dir: Optional[Path] = None) -> LocalCluster:
    """Start ``nodes`` Ray nodes on this machine, the first the head; return once all are up.

    A worker inherits its raylet's working folder, so relative paths of a run (verl's checkpoint folder,
    ``checkpoints/<project>/<experiment>`` by default) resolve in ``cwd`` (default: this process's), not in the
    folder the run is launched from. Each node's output goes to ``<temp_dir>/node<i>.log``.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise LocalClusterError(f"--nodes={nodes} --gpus-per-node={gpus_per_node}: both must be at least 1")
    # Short, in the system's temp folder: Ray's sockets live under it, and a socket path has at most 107 characters.
    temp_dir = str(temp_dir or tempfile.mkdtemp(prefix=TEMP_PREFIX))
    env = {**os.environ, **NODE_ENV, **_auth_env()}
    env.pop("RAY_ADDRESS", None)  # the head starts a cluster of its own
    cluster = LocalCluster(f"127.0.0.1:{_free_port()}", nodes, gpus_per_node, temp_dir, token=secrets.token_hex(16))
    (Path(temp_dir) / MARK).write_text(cluster.token)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        for index in range(nodes):
            log = Path(temp_dir) / f"node{index}.log"
            with open(log, "w") as sink:
                process = subprocess.Popen(
                    _node_command(cluster.address, index == 0, gpus_per_node, cpus_per_node, temp_dir), cwd=cwd,
                    env=env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            cluster.pids.append(process.pid)
            # One node at a time: a node cannot join before the head answers, and on a small machine the
            # starts run faster one after the other than side by side.
            _wait_started(process, log, deadline)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def stop(cluster: LocalCluster, grace_s: float = 15.0) -> None:
    """Stop the cluster's nodes and remove its temp dir: SIGTERM to each ``ray start`` (Ray stops its node's
    processes, in a few seconds; a SIGTERM to the whole group instead leaves the raylet and the GCS waiting on
    each other), then SIGKILL to whatever is left in each node's process group. Only what ``start`` made: a
    process of this user's whose command line is that node's ``ray start`` (its ``--temp-dir``), and the temp dir
    when it holds the cluster's mark (``check_record`` refuses a record that names anything else)."""
    leaders = [pid for pid in cluster.pids if _is_node(pid, cluster)]
    for pid in reversed(leaders):  # the head last: the other nodes leave it first
        _signal(os.kill, pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid in leaders:
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal(os.killpg, pid, signal.SIGKILL)
    for pid in cluster.pids:
        try:
            os.waitpid(pid, 0)  # started by this process (not so for the command's stop): reap it
        except ChildProcessError:
            pass
    if _marked(cluster):
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def _marked(cluster: LocalCluster) -> bool:
    """The temp dir holds the mark ``start`` left with this cluster's token."""
    try:
        return bool(cluster.token) and (Path(cluster.temp_dir) / MARK).read_text() == cluster.token
    except OSError:
        return False


def _is_node(pid: int, cluster: LocalCluster) -> bool:
    """Whether ``pid`` is still one of the cluster's ``ray start``, a process of this user's whose arguments hold
    ``ray start`` and ``--temp-dir=<the cluster's>``: the command's ``stop`` reads the ids from a file, and the id
    of a node that has died since may be another process's by now."""
    try:
        if Path(f"/proc/{pid}").stat().st_uid != os.getuid():
            return False
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return "start" in arguments and f"--temp-dir={cluster.temp_dir}" in arguments


def check_record(record: Any, path: Path) -> LocalCluster:
    """The cluster a state file records, checked before ``stop`` acts on it: its fields and their types, whole
    positive pids, and a temp dir that ``start`` made (an absolute ``ray-apo-*`` folder of the system's temp
    folder, this user's, holding the mark with the recorded token). Anything else is one ``LocalClusterError``
    line naming the file; nothing is stopped or removed."""
    def bad(why: str) -> LocalClusterError:
        return LocalClusterError(f"{path}: {why}; not a cluster this command started: nothing was stopped or "
                                 f"removed (delete the file if no cluster of yours is running)")

    fields_ = {"address": str, "nodes": int, "gpus_per_node": int, "temp_dir": str, "pids": list, "token": str}
    if not isinstance(record, dict) or set(record) != set(fields_):
        raise bad("not the record of a local cluster")
    for key, kind in fields_.items():
        if not isinstance(record[key], kind) or isinstance(record[key], bool):
            raise bad(f"{key} is not a {kind.__name__}")
    if not all(isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 for pid in record["pids"]):
        raise bad("pids are not process ids")
    cluster = LocalCluster(**record)
    folder = Path(cluster.temp_dir)
    if not folder.is_absolute() or folder.parent != Path(tempfile.gettempdir()) or \
            not folder.name.startswith(TEMP_PREFIX):
        raise bad(f"temp_dir {cluster.temp_dir!r} is not a {TEMP_PREFIX}* folder of {tempfile.gettempdir()}")
    if folder.exists():
        if folder.is_symlink() or folder.lstat().st_uid != os.getuid() or not _marked(cluster):
            raise bad(f"temp_dir {cluster.temp_dir} does not hold this cluster's mark")
    return cluster


def _signal(send, pid: int, sig: int) -> None:
    try:
        send(pid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def local_cluster(nodes: int = 2, gpus_per_node: int = 1, cwd: Optional[Path] = None) -> Iterator[LocalCluster]:
    """``start`` ... ``stop``, for tests: the cluster is stopped whatever happens inside."""
    cluster = start(nodes, gpus_per_node, cwd=cwd)
    try:
        yield cluster
    finally:
        stop(cluster)


# ---- the command ---------------------------------------------------------------------------------------------------
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe_apo.cpu.local_cluster",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    started = commands.add_parser("start", help="start the nodes and print the overrides a run adds")
    started.add_argument("--nodes", type=int, default=2, help="Ray nodes, the head included (default 2)")
    started.add_argument("--gpus-per-node", type=int, default=1,
                         help="FSDP workers per node: trainer.n_gpus_per_node (default 1)")
    commands.add_parser("stop", help="stop the cluster that start started")
    args = parser.parse_args(argv)
    try:
        state = state_file()
        if args.command == "stop" and not state.parent.exists():
            raise LocalClusterError(f"no local cluster is recorded in {state}")
        _own_folder(state.parent, create=args.command == "start")
        if args.command == "start":
            if state.exists():
                raise LocalClusterError(f"a local cluster is already recorded in {state}: stop it first")
            cluster = start(args.nodes, args.gpus_per_node)
            descriptor = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(json.dumps(asdict(cluster)))
            print(f"address: {cluster.address}")
            print(f"overrides: {' '.join(cluster.overrides())}")
            print(f"run the rehearsal from {Path.cwd()} (the nodes' working folder); nodes' output: "
                  f"{cluster.temp_dir}/node*.log")
            return 0
        if not state.is_file():
            raise LocalClusterError(f"no local cluster is recorded in {state}")
        try:
            record = json.loads(state.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise LocalClusterError(f"{state}: unreadable ({type(exc).__name__}); nothing was stopped or removed "
                                    "(delete the file if no cluster of yours is running)") from None
        stop(check_record(record, state))
        state.unlink()
        print("stopped")
        return 0
    except LocalClusterError as exc:
        print(f"local_cluster: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
