"""What the tests in `integration/test_store.py` and `unit/store/test_local.py` share (under
tests/)."""

from __future__ import annotations

import sqlite3


def _sql(db, *statements):
    con = sqlite3.connect(db)
    with con:
        for statement in statements:
            con.execute(statement)
    con.close()
