"""SubmitCommandLine: a gsub/sbatch command line, parsed here as gsub would parse it (cli/fastpath.py).

Why here: on the controller host a gsub call should cost ~20 ms, and parsing its options in the client costs
twice that in imports alone (argparse, re, dataclasses, the model). The controller has them loaded, so the
client sends its argv, environment, working directory and umask, and this module runs the very parser gsub
runs (garrison/cmdline/submission.py), with the same messages.

What the parser would read from the client's machine, the client supplies; nothing here reads a file, so a
user cannot have the controller read a file for them. A script named on the command line is asked for
(``need_script``) and the client reads it with its own rights and asks again; so is another file an option
names (``need_file``: -F/--nodefile), and standard input (``need_stdin``), each only when the parse needs it,
as gsub reads them only then.
"""

from __future__ import annotations

import errno as errno_names
import os
from collections.abc import Callable
from dataclasses import dataclass

from garrison.cmdline.argparser import UsageError
from garrison.cmdline.submission import HelpRequested, Submission, parse_submission, with_default_output
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert import InvalidRequest
from garrison.wire.convert_spec import spec_to_pb

MAX_ARGS = 4096  # words on one command line; more is not a command line anyone typed
PROGS = ("gsub", "sbatch")


class _ScriptNeeded(Exception):
    """The parse reached the script file, which the client has not sent yet."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class _FileNeeded(Exception):
    """The parse reached another file (-F/--nodefile), which the client has not sent yet."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class _StdinNeeded(Exception):
    """The parse wants the script on standard input, which the client has not sent yet."""


@dataclass(frozen=True)
class Parsed:
    """A command line that parsed: the SubmitJob request to carry out, and what the client prints after it."""

    request: pb.SubmitJobRequest
    submission: Submission


def parse_command_line(request: pb.SubmitCommandLineRequest) -> Parsed | pb.SubmitCommandLineResponse:
    """``request``'s command line parsed: the job to submit, or the answer to give without submitting."""
    if len(request.argv) > MAX_ARGS:
        raise InvalidRequest(f"too many arguments: at most {MAX_ARGS}")
    if request.prog not in PROGS:
        raise InvalidRequest(f"prog must be one of {', '.join(PROGS)}, not {request.prog!r}")
    if not os.path.isabs(request.cwd):
        raise InvalidRequest(f"cwd must be an absolute path, not {request.cwd!r}")
    if request.umask > 0o777:
        raise InvalidRequest(f"umask must be at most 0777, not {request.umask:o}")
    try:
        submission = parse_submission(
            list(request.argv), dict(request.environment), request.cwd,
            stdin=_stdin_of(request), prog=request.prog, read_file=_script_reader(request), umask=request.umask,
            read_other_file=_other_file_reader(request),
        )
    except _ScriptNeeded as needed:
        return pb.SubmitCommandLineResponse(need_script=needed.path)
    except _FileNeeded as needed:
        return pb.SubmitCommandLineResponse(need_file=needed.path)
    except _StdinNeeded:
        return pb.SubmitCommandLineResponse(need_stdin=True)
    except HelpRequested as help_text:
        text = help_text.text if request.prog == "gsub" else help_text.text.replace("gsub", request.prog)
        return pb.SubmitCommandLineResponse(help=text)
    except UsageError as mistake:
        return pb.SubmitCommandLineResponse(usage_error=str(mistake))
    submission = with_default_output(submission, request.default_output or None,
                                     request.default_array_output or None)
    return Parsed(_submit_request(submission), submission)


def _submit_request(submission: Submission) -> pb.SubmitJobRequest:
    """What gsub would send (garrison/cmdline/submission.py's submit_request), as the message itself: the
    plain form's conversion through protobuf's JSON mapping cost more than the parse."""
    request = pb.SubmitJobRequest(spec=spec_to_pb(submission.spec), hold=submission.hold,
                                  test_only=submission.test_only)
    if submission.array is not None:
        request.array_indices.extend(submission.array.indices)
        if submission.array.max_running is not None:
            request.array_max_running = submission.array.max_running
    return request


def submitted_response(submission: Submission, submitted: pb.SubmitJobResponse) -> pb.SubmitCommandLineResponse:
    """The answer for a job submitted (or estimated): with what the client needs of the parse to print and
    act as gsub does."""
    return pb.SubmitCommandLineResponse(submitted=submitted, ignored=submission.ignored,
                                        parsable=submission.parsable, test_only=submission.test_only,
                                        wait=submission.wait)


def _script_reader(request: pb.SubmitCommandLineRequest) -> Callable[[str], bytes]:
    def read(path: str) -> bytes:  # the script's path joined to cwd, as the client is to open it
        if request.script_path != path:
            raise _ScriptNeeded(path)
        if request.HasField("script"):
            return request.script
        code = request.script_errno or errno_names.EIO
        raise OSError(code, os.strerror(code))  # FileNotFoundError etc., by errno, as open() raises them

    return read


def _other_file_reader(request: pb.SubmitCommandLineRequest) -> Callable[[str], bytes]:
    def read(path: str) -> bytes:  # another file an option names (-F/--nodefile), joined to cwd
        if path in request.files:
            return request.files[path]
        if path not in request.file_errnos:
            raise _FileNeeded(path)
        code = request.file_errnos[path] or errno_names.EIO
        raise OSError(code, os.strerror(code))

    return read


def _stdin_of(request: pb.SubmitCommandLineRequest) -> Callable[[], bytes] | None:
    if not request.stdin_readable:
        return None  # a terminal or closed: gsub does not wait for a script there
    if request.HasField("stdin"):
        return lambda: request.stdin

    def needed() -> bytes:
        raise _StdinNeeded

    return needed
