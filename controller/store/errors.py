"""The one error the store's callers see when the database cannot be reached or cannot take a write.

Whatever the driver says (PostgreSQL restarting or stopped, a connection cut, SQLite's disk full or a
read-only file, a pool that cannot hand out a connection in time), the store raises ``StoreUnavailable``
from it. The controller treats it as "nothing changed, try again later": memory is left as it was, a
client gets gRPC UNAVAILABLE with ``StoreUnavailable.MESSAGE`` (never the driver's own words), and the
agents' reports are retried (docs/operations.md, "When the database fails").

Errors that say our statement is wrong (an integrity or programming error) are bugs, not outages: they
pass through unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import exc as sa_exc


class StoreUnavailable(Exception):
    """The database is unavailable (down, unreachable, full or read-only): nothing was written."""

    MESSAGE = "the database is unavailable, retry"

    def __init__(self, cause: str = "") -> None:
        super().__init__(self.MESSAGE)
        self.cause = cause  # the driver's words, for the controller's log only


class JobIdsTaken(Exception):
    """A write that was to take job ids from the counter (``StoreChanges.job_ids``) found the counter moved
    on: someone else took ids since the controller last read it. Nothing was written; the caller reserves
    ids again with ``allocate_job_ids``."""


def is_outage(error: BaseException) -> bool:
    """Whether a SQLAlchemy error means the database could not do the work, rather than refused it."""
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, sa_exc.IntegrityError | sa_exc.ProgrammingError | sa_exc.DataError):
        return False
    # OperationalError: refused connections, restarts, "database or disk is full", read-only files, locks.
    # InterfaceError/InternalError: a connection the server closed under us. TimeoutError: the pool.
    return isinstance(
        error,
        sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.InternalError | sa_exc.TimeoutError
        | sa_exc.DisconnectionError,
    )


@contextlib.contextmanager
def outages_as_unavailable() -> Iterator[None]:
    """Run a store operation; a database outage leaves it as ``StoreUnavailable``."""
    try:
        yield
    except sa_exc.SQLAlchemyError as error:
        if is_outage(error):
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise StoreUnavailable(first_line) from error
        raise
    except OSError as error:  # a file the SQLite driver could not open or write outside SQL (ENOSPC, EROFS)
        raise StoreUnavailable(str(error)) from error
