"""gsub, sbatch, gqueue and gjob on the controller host in ~20 ms: one request on the local socket, and
nothing imported that a bare interpreter has not loaded.

Why: a bare interpreter starts in ~10 ms, and parsing gsub's options here would cost ~40 ms more in imports
(argparse, re, dataclasses, the job model). The controller has all of them loaded already: on its local
socket this module sends gsub's command line itself (SubmitCommandLine, controller/rpc/commandline.py), and
the controller runs the very parser gsub runs. A script file, or a script on standard input, is read here,
with the caller's rights, when the controller asks for it. What comes back is printed exactly as gsub prints
it. gqueue (the options it reads, into a pipe) and gjob (one job id) ask ListJobs and GetJob in plain JSON and
print with cli/render.py, which imports nothing heavy either.

This module imports only what the interpreter has built in (``posix``, ``pwd``, ``_socket``, ``_json``,
``binascii``), not even ``os``: an interpreter started without ``site`` (the launchers' -S) has not loaded it,
and ``os`` with what it imports (``_collections_abc``, ``stat``, ``posixpath``) costs ~5 M instructions, a
quarter of a bare start-up's ~21 M (counted with callgrind). The few things of ``os`` used here are below. Whenever it cannot be sure of doing what a command's full path
would (no controller address known without reading TOML, no cached local socket, a token or gRPC asked for,
an option it does not read, an older controller), it returns False before anything was submitted, and the
caller runs the full path (cli/gsub.py, cli/gqueue.py, cli/gjob.py), which also fills the caches this one
reads: the controller's sockets per address, and the configuration file's address per file identity.
"""

from __future__ import annotations

import posix
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

CACHE_FORMAT = "garrison-controller-endpoints 1"  # first line of the per-address cache file
SUBMIT_METHOD = b"SubmitCommandLine+json"
OK, RESOURCE_EXHAUSTED, UNIMPLEMENTED = 0, 8, 12
DEADLINE_S = 30.0
# controller/ratelimit.py's refusal of a user's request past the request rate: nothing was done, and the
# controller says when to ask again. A user's loop of sbatch never fails on a rate under Slurm (it has no such
# default), so the CLI waits and asks again, as Slurm's commands back off when slurmctld rate-limits them.
RATE_LIMITED = "too many requests from "
EXIT_USAGE = 2
# sbatch's differences from gsub (cli/slurm/sbatch.py): its default output files, and every error exits 1
SBATCH = "sbatch"
SBATCH_DEFAULT_OUTPUT = "slurm-%j.out"
SBATCH_DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"
SBATCH_USAGE_EXIT = 1


def _environ() -> Mapping[str, str]:
    """``os.environ``: itself where ``os`` is loaded (the full path imports this module too, and may have
    changed it); else posix's bytes, decoded as ``os.fsdecode`` decodes them, once."""
    loaded = sys.modules.get("os")
    if loaded is not None:
        return loaded.environ  # type: ignore[no-any-return]
    global _decoded_environ
    if _decoded_environ is None:
        encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
        _decoded_environ = {key.decode(encoding, errors): value.decode(encoding, errors)
                            for key, value in posix.environ.items()}
    return _decoded_environ


_decoded_environ: dict[str, str] | None = None


def _join(directory: str, name: str) -> str:
    """``os.path.join(directory, name)``."""
    if name.startswith("/") or not directory:
        return name
    return directory + name if directory.endswith("/") else f"{directory}/{name}"


def _home() -> str:
    """``os.path.expanduser("~")``: $HOME, else the password database's home directory."""
    home = _environ().get("HOME")
    if home is None:
        import pwd

        try:
            home = pwd.getpwuid(posix.getuid()).pw_dir
        except KeyError:
            return "~"  # as expanduser leaves it
    return home.rstrip("/") or "/"


def _make_directories(path: str, mode: int) -> None:
    """``os.makedirs(path, mode, exist_ok=True)`` for an absolute or relative path."""
    try:
        posix.mkdir(path, mode)
    except FileExistsError:
        return
    except FileNotFoundError:
        parent = path.rstrip("/").rpartition("/")[0]
        if not parent or parent == path:
            raise
        _make_directories(parent, mode)
        try:
            posix.mkdir(path, mode)
        except FileExistsError:
            pass


def _cache_home() -> str:
    base = _environ().get("XDG_CACHE_HOME") or _join(_home(), ".cache")
    return _join(base, "garrison")


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text)[:80]


CONFIG_CACHE_FORMAT = "garrison-config-address 1"
DEFAULT_CONFIG_PATH = "/etc/garrison/garrison.toml"  # garrison/config/schema.py's, without importing it


def config_path() -> str:
    """The configuration file the CLI reads the controller's address from (garrison/config/loading.py)."""
    return _environ().get("GARRISON_CONFIG") or DEFAULT_CONFIG_PATH


def config_identity(path: str) -> str | None:
    """What changes when the file does: its device, inode, size and modification time."""
    try:
        st = posix.stat(path)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def config_cache_file(path: str) -> str:
    return _join(_cache_home(), f"config-{posix.geteuid()}-{_file_safe(path)}.cache")


def cached_config_address(path: str) -> str | None:
    """The controller address the configuration file at ``path`` held when cli/client.py last read it, if the
    file has not changed since (reading TOML costs the CLI more than the rest of a call: tomllib imports re)."""
    identity = config_identity(path)
    if identity is None:
        return None
    try:
        with open(config_cache_file(path), encoding="utf-8") as cached:
            lines = cached.read().split("\n")
    except (OSError, ValueError):
        return None
    if len(lines) == 4 and lines[0] == CONFIG_CACHE_FORMAT and lines[1] == path and lines[2] == identity:
        return lines[3] or None
    return None


def remember_config_address(path: str, identity: str | None, address: str) -> None:
    """Cache ``address`` as what the file at ``path``, as it was when read (``identity``), says."""
    if identity is not None:
        write_cache(config_cache_file(path), (CONFIG_CACHE_FORMAT, path, identity, address))


def write_cache(cache: str, fields: tuple[str, ...]) -> None:
    """One cache file, one field a line, replaced whole. A field holding a newline is not representable: the
    next call asks again; so does one after a failed write (a read-only home)."""
    if any("\n" in field for field in fields):
        return
    try:
        _make_directories(cache.rpartition("/")[0] or ".", 0o700)
        tmp = f"{cache}.{posix.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            out.write("\n".join(fields))
        posix.replace(tmp, cache)
    except OSError:
        pass


def controller_address() -> str | None:
    """GARRISON_CONTROLLER, else the configuration file's address where it is cached; None otherwise."""
    return _environ().get("GARRISON_CONTROLLER") or cached_config_address(config_path())


def endpoint_cache_file(address: str) -> str:
    """Where the CLI caches what the controller at ``address`` told it of its sockets (cli/client.py writes
    it after a Hello). The address, made file-name safe, names the file; the file also holds the address in
    full, and is only believed when that matches (names of two addresses may coincide)."""
    return _join(_cache_home(), f"controller-{posix.geteuid()}-{_file_safe(address)}.cache")


def cached_endpoints(address: str) -> dict[str, str] | None:
    """The cached credential and local socket paths of the controller at ``address``, if any."""
    try:
        with open(endpoint_cache_file(address), encoding="utf-8") as cached:
            lines = cached.read().split("\n")
    except (OSError, ValueError):
        return None
    if len(lines) == 4 and lines[0] == CACHE_FORMAT and lines[1] == address:
        return {"credential_socket": lines[2], "local_socket": lines[3]}
    return None


def _local_connection() -> tuple[str, Any] | None:
    """The controller's address and a connection to its local socket, where the fast path may use them."""
    environ = _environ()
    if environ.get("GARRISON_TRANSPORT") == "grpc" or environ.get("GARRISON_TOKEN") or environ.get("GARRISON_TOKEN_FILE"):
        return None
    address = controller_address()
    if not address:
        return None
    endpoints = cached_endpoints(address)
    if endpoints is None or not endpoints["local_socket"]:
        return None
    connection = _connect(endpoints["local_socket"])
    return None if connection is None else (address, connection)


def submit(args: list[str], prog: str, usage_exit: int = EXIT_USAGE, default_output: str = "",
           default_array_output: str = "", honour_quiet: bool = False) -> bool:
    """Submit ``prog args`` as cli/gsub.py's ``submit`` would, with the same arguments, output and exit
    status; False, having submitted nothing, where only the full path can (see the module's docstring)."""
    if prog == SBATCH and args in (["-V"], ["--version"]):
        return False  # Slurm's version line, which sbatch's full path prints (cli/slurm/__init__.py)
    local = _local_connection()
    if local is None:
        return False
    address, connection = local
    try:
        cwd = posix.getcwd()
        request: dict[str, Any] = {
            "argv": args, "environment": dict(_environ()), "cwd": cwd, "umask": _umask(), "prog": prog,
            "default_output": default_output, "default_array_output": default_array_output,
            "stdin_readable": _stdin_readable(),
        }
        request.update(_offered_script(args, cwd))
        asked = False  # the controller asked for a script or standard input: it speaks this protocol
        while True:
            try:
                status, answer = _exchange(connection, SUBMIT_METHOD, request)
            except OSError as lost:  # sent, perhaps taken: asking again could submit the job twice
                from garrison.cli.client import UNAVAILABLE, _error_for, fail

                fail(prog, _error_for(UNAVAILABLE, f"the connection was lost ({lost}); the job may have been "
                                      "submitted: look with gqueue before submitting it again", address))
            if status == UNIMPLEMENTED and not asked:
                return False  # a controller older than this command: the full path still works
            if status != OK:
                _fail(prog, status, answer, address, usage_exit)
            response = _loads(answer)
            if "need_script" in response:
                asked = True
                request.pop("script", None)  # what was offered, if anything, was another file
                request["script_path"] = response["need_script"]
                try:
                    with open(response["need_script"], "rb") as script:
                        request["script"] = script.read()
                except OSError as error:
                    request["script_errno"] = error.errno or 5
                continue
            if "need_file" in response:
                asked = True
                path = response["need_file"]
                try:
                    with open(path, "rb") as other:
                        request.setdefault("files", {})[path] = other.read(MAX_OTHER_FILE + 1)
                except OSError as error:
                    request.setdefault("file_errnos", {})[path] = error.errno or 5
                continue
            if response.get("need_stdin"):
                asked = True
                request["stdin"] = sys.stdin.buffer.read()
                continue
            break
    finally:
        connection.close()  # _socket's sockets are not context managers
    _report(response, prog, usage_exit, honour_quiet)
    return True


MAX_OFFERED_SCRIPT = 1 << 20
MAX_OTHER_FILE = 1 << 20  # -F/--nodefile: a node list past this is refused by the parse, not sent whole


def _offered_script(args: list[str], cwd: str) -> dict[str, Any]:
    """The script the command line most likely names, sent with the first request so that the controller
    need not ask for it (``need_script``, a second round trip and a second parse): the first argument that
    is no option and names a readable file starting with ``#!``, as every batch script must. Only a guess:
    the controller's parse decides, and asks for another path if the script is another file."""
    for arg in args:
        if arg.startswith("-") or not arg:
            continue
        path = _join(cwd, arg)  # as the controller's parse joins it (garrison/cmdline/submission.py)
        try:
            with open(path, "rb") as candidate:
                if candidate.read(2) != b"#!":
                    continue
                text = b"#!" + candidate.read(MAX_OFFERED_SCRIPT)
        except OSError:
            continue  # not a readable file (a job name, a directory, an argument of the script)
        if len(text) > MAX_OFFERED_SCRIPT:
            return {}  # too large to send unasked; the controller asks for it if it is the script
        return {"script_path": path, "script": text}
    return {}


def _query(prog: str, calls: Callable[[Callable[[str, dict[str, Any]], dict[str, Any]]], None]) -> bool:
    """Run ``calls(call)`` with ``call(method, request) -> answer`` on the local socket: False where the fast
    path cannot be used (nothing was asked then); an error answer is the command's one-line error."""
    local = _local_connection()
    if local is None:
        return False
    address, connection = local

    class _Unimplemented(Exception):
        pass

    def call(method: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            status, answer = _exchange(connection, method.encode() + b"+json", request)
        except OSError as lost:
            from garrison.cli.client import UNAVAILABLE, _error_for, fail

            fail(prog, _error_for(UNAVAILABLE, f"the connection was lost ({lost})", address))
        if status == UNIMPLEMENTED:
            raise _Unimplemented
        if status != OK:
            _fail(prog, status, answer, address)
        return _loads(answer)

    try:
        calls(call)
    except _Unimplemented:
        return False  # a controller older than this command: only reads were made, the full path asks again
    finally:
        connection.close()
    return True


def _fail(prog: str, status: int, answer: bytes, address: str, usage_exit: int = EXIT_USAGE) -> None:
    """The controller's refusal as the command's one-line error; one it exits EXIT_USAGE for (the request
    itself is wrong) exits ``usage_exit`` instead (sbatch: 1, as every error of sbatch's)."""
    from garrison.cli.client import _error_for, as_refusal, fail

    fail(prog, as_refusal(_error_for(status, answer.decode(errors="replace"), address), usage_exit))


# ---------------------------------------------------------------------------------------------------------------
# gqueue (squeue's counterpart) and gjob (scontrol show job's)

# What squeue shows when asked for no state: "pending, running, and completing jobs".
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
# gqueue's options the fast path reads, exactly as spelt here; any other word sends gqueue down its full path
# (cli/gqueue.py, argparse), which then parses the whole command line itself.
QUEUE_LISTS = {"-u": "users", "--user": "users", "-t": "states", "--states": "states", "-j": "jobs",
               "--jobs": "jobs", "-p": "partitions", "--partition": "partitions", "-A": "accounts",
               "--account": "accounts", "-n": "names", "--name": "names"}
QUEUE_FLAGS = {"-h": "noheader", "--noheader": "noheader", "-r": "expand_arrays", "--array": "expand_arrays",
               "--me": "me"}


def split_values(values: list[str]) -> list[str]:
    return [v for value in values for v in value.split(",") if v]


def queue_states(given: list[str], job_ids: list[str]) -> list[str]:
    """The states to ask for; [] means every state. Asked for by id, a job shows whatever its state, as in
    squeue -j."""
    states = [s.upper() for s in split_values(given)]
    if "ALL" in states:
        return []
    if states or job_ids:
        return states
    return list(ACTIVE_STATES)


def list_request(users: list[str], states: list[str], job_ids: list[str], filters: dict[str, list[str]],
                 fold: bool) -> dict[str, Any]:
    """gqueue's ListJobs request, in its plain form; ``fold``: each array's pending tasks as one row."""
    return {"users": users, "states": states, "job_ids": job_ids, **filters, "fold_pending_arrays": fold}


def _queue_options(args: list[str]) -> dict[str, Any] | None:
    """gqueue's command line, where it uses only the options the fast path reads; else None."""
    options: dict[str, Any] = {name: [] for name in QUEUE_LISTS.values()}
    options.update((name, False) for name in QUEUE_FLAGS.values())
    words = iter(args)
    for word in words:
        if word in QUEUE_FLAGS:
            options[QUEUE_FLAGS[word]] = True
            continue
        name, equals, value = word.partition("=")
        if name not in QUEUE_LISTS or (equals and not name.startswith("--")):
            return None
        if not equals:
            value = next(words, "")
        if not value or value.startswith("-"):
            return None  # argparse's business: its error, or its reading of a value that looks like an option
        options[QUEUE_LISTS[name]].append(value)
    return options


def gqueue(args: list[str]) -> bool:
    """gqueue into a pipe or a file, with the options above: one ListJobs, folded by the controller."""
    if sys.stdout.isatty():
        return False  # a terminal gets rich's table, from the full path
    options = _queue_options(args)
    if options is None:
        return False
    users = split_values(options["users"])
    if options["me"]:
        import getpass

        users.append(getpass.getuser())
    job_ids = split_values(options["jobs"])
    filters = {"names": split_values(options["names"]), "partitions": split_values(options["partitions"]),
               "accounts": split_values(options["accounts"])}
    request = list_request(users, queue_states(options["states"], job_ids), job_ids, filters,
                           fold=not options["expand_arrays"])

    def show(call: Callable[[str, dict[str, Any]], dict[str, Any]]) -> None:
        from garrison.cli.render import JOB_COLUMNS, job_row, plain_table
        from garrison.plainmsg import PlainMessage

        jobs = call("ListJobs", request).get("jobs", [])
        text = plain_table(JOB_COLUMNS, [job_row(PlainMessage(job)) for job in jobs], header=not options["noheader"])
        if text:  # no header and no jobs: nothing at all, as squeue -h prints
            print(text)

    return _query("gqueue", show)


def gjob(args: list[str]) -> bool:
    """``gjob ID``: the job's details, and for a pending job why it waits."""
    if len(args) != 1 or args[0].startswith("-"):
        return False
    job_id = args[0]

    def show(call: Callable[[str, dict[str, Any]], dict[str, Any]]) -> None:
        from garrison.cli.render import job_detail
        from garrison.plainmsg import PlainMessage

        job = PlainMessage(call("GetJob", {"job_id": job_id}))
        print(job_detail(job))
        if job.state == "PENDING":
            details = call("QueueDetails", {"job_ids": [job_id], "explain": True})
            sentences = [s for detail in details.get("jobs", []) for s in detail.get("explanation", [])]
            print("   Why=" + ("; ".join(sentences) if sentences else WHY_NOT_LOOKED_AT))

    return _query("gjob", show)


WHY_NOT_LOOKED_AT = "not looked at by a scheduling cycle yet"


def _report(response: dict[str, Any], prog: str, usage_exit: int, honour_quiet: bool) -> None:
    """Print what gsub prints for ``response``, and exit as it exits."""
    if "help" in response:
        print(response["help"])
        sys.exit(0)
    if "usage_error" in response:
        print(f"{prog}: error: {response['usage_error']}", file=sys.stderr)
        sys.exit(usage_exit)
    ignored = response.get("ignored", [])
    quiet = honour_quiet and "--quiet" in ignored
    if ignored and not quiet:
        print(f"{prog}: warning: ignoring {', '.join(ignored)}: Garrison does not act on "
              f"{'it' if len(ignored) == 1 else 'them'}", file=sys.stderr)
    submitted = response["submitted"]
    if response.get("test_only"):
        from garrison.cli.gsub import estimate_line
        from garrison.plainmsg import PlainMessage

        print(f"{prog}: {estimate_line(PlainMessage(submitted))} (not submitted)", file=sys.stderr)
        return
    job_id = submitted.get("job_id", 0)
    if response.get("parsable"):
        print(job_id)
    elif not quiet:
        print(f"Submitted batch job {job_id}")
    if response.get("wait"):
        from garrison.cli.gsub import _wait

        _wait(str(job_id), prog)


def _connect(path: str) -> Any:
    import _socket

    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    connection.settimeout(DEADLINE_S)
    try:
        connection.connect(path)
        # Only a socket served by root or by ourselves is the controller (as cli/client.py checks): anyone
        # may create a socket at a path in a shared directory, and requests carry scripts and environments.
        credentials = connection.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
        if int.from_bytes(credentials[4:8], sys.byteorder) not in (0, posix.geteuid()):
            raise OSError(f"{path} is served by another user")
    except OSError:
        connection.close()
        return None
    return connection


def _exchange(connection: Any, method: bytes, request: dict[str, Any]) -> tuple[int, bytes]:
    """One request and its answer (controller/rpc/local.py's framing): the status and the payload. A request
    refused for the user's request rate is asked again when the controller says, within the call's deadline."""
    body = _dumps(request).encode()
    frame = bytes([len(method)]) + method + body

    def once() -> bytes:
        connection.sendall((len(frame)).to_bytes(4, "big") + frame)
        length = int.from_bytes(_receive(connection, 4), "big")
        return _receive(connection, length)

    answer = patiently(once)
    return answer[0], answer[1:]


def patiently(exchange: Callable[[], bytes]) -> bytes:
    """``exchange()``: one request on the local socket and its answer (a status byte, then the payload), made
    again while the answer is the controller's refusal for the user's request rate, when it says
    (``rate_limit_wait``)."""
    waited = 0.0
    while True:
        answer = exchange()
        wait = rate_limit_wait(answer[0], answer[1:], waited)
        if wait is None:
            return answer
        import time

        time.sleep(wait)
        waited += wait


def rate_limit_wait(status: int, answer: bytes | str, waited: float) -> float | None:
    """How long to wait before asking again where ``answer`` is the controller's refusal for the request rate
    and the call's deadline leaves time for it (``waited``: what this call has waited so far); else None."""
    text = answer.decode(errors="replace") if isinstance(answer, bytes) else answer
    if status != RESOURCE_EXHAUSTED or not text.startswith(RATE_LIMITED):
        return None
    try:
        wait = float(text.rpartition("retry in ")[2].rstrip("s"))
    except ValueError:
        wait = 0.1
    wait = min(max(wait, 0.005), 1.0)  # at least a token's worth of the rate, at most a second at a time
    return wait if waited + wait <= DEADLINE_S else None


def _receive(connection: Any, count: int) -> bytes:
    chunks = []
    while count:
        chunk = connection.recv(min(count, 1 << 20))
        if not chunk:
            raise ConnectionResetError("the controller closed the connection")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _dumps(value: Any) -> str:
    """JSON for the plain request: strings, booleans, integers, finite floats, lists, string-keyed dicts and
    bytes (base64, as protobuf's JSON mapping writes them). json itself imports re and enum, ~6 ms."""
    import _json

    quote = _json.encode_basestring_ascii
    if isinstance(value, str):
        return quote(value)
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value - value == 0:  # finite: json writes NaN and Infinity its own way
        return float.__repr__(value)
    if isinstance(value, bytes):
        import binascii

        return quote(binascii.b2a_base64(value, newline=False).decode())
    if isinstance(value, dict):
        return "{" + ",".join(f"{quote(key)}:{_dumps(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_dumps(item) for item in value) + "]"
    raise TypeError(f"no plain form for {type(value).__name__}")


class _JsonContext:
    """What _json's C scanner reads of a decoder: json.loads' defaults, without importing json."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, str] = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name)


def _loads(payload: bytes) -> dict[str, Any]:
    import _json

    value, _ = _json.make_scanner(_JsonContext)(payload.decode(), 0)  # type: ignore[arg-type]
    return value  # type: ignore[no-any-return]


def _umask() -> int:
    mask = posix.umask(0o022)  # reading the umask means setting it; set it straight back
    posix.umask(mask)
    return mask


def _stdin_readable() -> bool:
    """Whether a script may come from standard input: not a terminal, not closed (as gsub's full path)."""
    try:
        return sys.stdin is not None and not sys.stdin.isatty()
    except ValueError:
        return False


def gqueue_main() -> None:
    """bin/gqueue: the fast path, else cli/gqueue.py's."""
    _run_or_fall_back(gqueue, "garrison.cli.gqueue")


def gjob_main() -> None:
    """bin/gjob: the fast path, else cli/gjob.py's."""
    _run_or_fall_back(gjob, "garrison.cli.gjob")


def gsub_main() -> None:
    """bin/gsub: the fast path, else cli/gsub.py's."""
    _run_or_fall_back(lambda args: submit(args, "gsub"), "garrison.cli.gsub")


def sbatch_main() -> None:
    """bin/garrison-sbatch (sbatch): the fast path with sbatch's differences (cli/slurm/sbatch.py), else its full
    path."""
    _run_or_fall_back(lambda args: submit(args, SBATCH, SBATCH_USAGE_EXIT, SBATCH_DEFAULT_OUTPUT,
                                          SBATCH_DEFAULT_ARRAY_OUTPUT, honour_quiet=True),
                      "garrison.cli.slurm.sbatch")


def _run_or_fall_back(fast: Callable[[list[str]], bool], full_module: str) -> None:
    """``fast(arguments)``; where it declines, ``full_module``'s ``main()``. A closed pipe on our output
    (``gsub | head``) exits 1 without a traceback, as cli/client.py's run_command does. Where the fast path
    answered, the process ends at once (``_quick_exit``); the full path exits as Python does."""
    try:
        if fast(sys.argv[1:]):
            _quick_exit(0)
    except SystemExit as leaving:  # the fast path's error exits (a usage error, the controller's refusal)
        _quick_exit(leaving.code)
    except BrokenPipeError:
        _closed_pipe_exit()
    __import__(full_module, fromlist=["main"]).main()


def exit_after(main: Callable[[], object]) -> None:
    """``sys.exit(main())`` without the interpreter's finalization (``_quick_exit``), for the launchers of
    commands that make a request or two and print (scripts/gen_launchers.py's QUICK_EXIT). An exception
    other than SystemExit leaves as Python would (its traceback, status 1)."""
    try:
        code = main()
    except SystemExit as leaving:
        code = leaving.code
    _quick_exit(code)


def _quick_exit(code: object) -> None:
    """Exit as ``sys.exit(code)`` would, without the interpreter's finalization: tearing down the modules and
    the objects a command made costs as much as a quarter of a bare interpreter's start-up (~5 M
    instructions of its ~21 M, counted with callgrind), and nothing the fast path does needs it: it opens no
    file it leaves unclosed, starts no thread and registers nothing with atexit. Python's own rules for the
    exit status: None is 0, an integer is itself, anything else is printed to standard error and is 1."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    if sys.stdout is not None:  # None: started with standard output closed
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _closed_pipe_exit()
    if sys.stderr is not None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # nowhere left to say anything
    posix._exit(status & 0xFF)


def _closed_pipe_exit() -> None:
    """``gsub | head`` and the pipe closed: exit 1 quietly (the buffered output has nowhere to go)."""
    devnull = posix.open("/dev/null", posix.O_WRONLY)
    posix.dup2(devnull, sys.stdout.fileno())
    posix._exit(1)
