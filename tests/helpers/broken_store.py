"""A real SQLite store that can be made to refuse writes, as a database whose disk became read-only does.

While ``broken`` every connection the store checks out runs ``PRAGMA query_only=ON`` first, so each write fails in
SQLite itself and the driver raises its own ``sqlite3.OperationalError: attempt to write a readonly
database``, which the store turns into StoreUnavailable like any outage. Reads go on working, as they do
on a read-only file. Nothing of the store's own logic is replaced.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from garrison.controller.store import SqlStore, open_store


class BreakableStore:
    def __init__(self, url: str) -> None:
        store = open_store(url)
        assert isinstance(store, SqlStore)
        self.store = store
        self.broken = False
        # At each checkout, before the store's own BEGIN IMMEDIATE: the setting holds for the transaction.
        event.listen(store.engine, "checkout", self._on_checkout)

    def _on_checkout(self, dbapi_connection: Any, _record: object, _proxy: object) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA query_only={'ON' if self.broken else 'OFF'}")
        finally:
            cursor.close()

    def break_(self) -> None:
        self.broken = True

    def heal(self) -> None:
        self.broken = False
