"""A real SQLite store that can be made to refuse writes, as a database whose disk became read-only does.

While ``broken`` every transaction the store begins sets ``PRAGMA query_only=ON``, so each write fails in
SQLite itself and the driver raises its own ``sqlite3.OperationalError: attempt to write a readonly
database``, which the store turns into StoreUnavailable like any outage. Reads go on working, as they do
on a read-only file. Nothing of the store's own logic is replaced.
"""

from __future__ import annotations

from sqlalchemy import event
from sqlalchemy.engine import Connection

from garrison.controller.store import SqlStore, open_store


class BreakableStore:
    def __init__(self, url: str) -> None:
        store = open_store(url)
        assert isinstance(store, SqlStore)
        self.store = store
        self.broken = False
        # Per transaction, not per checkout (the store keeps one connection for its SQLite writes): set after
        # the store's own BEGIN IMMEDIATE, which the setting would refuse, and cleared as the transaction ends,
        # so that the connection starts each transaction as a fresh checkout would.
        event.listen(store.engine, "begin", self._on_begin)
        event.listen(store.engine, "commit", self._on_end)
        event.listen(store.engine, "rollback", self._on_end)

    def _on_begin(self, connection: Connection) -> None:
        if self.broken:
            connection.exec_driver_sql("PRAGMA query_only=ON")

    @staticmethod
    def _on_end(connection: Connection) -> None:
        connection.exec_driver_sql("PRAGMA query_only=OFF")

    def break_(self) -> None:
        self.broken = True

    def heal(self) -> None:
        self.broken = False
